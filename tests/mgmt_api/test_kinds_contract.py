"""The one table of kinds, and what is derived from it (pure: no server).

The FQN grammar, the server's registry, meshctl and the console all read
``meshplane/kinds_contract.py``; these tables check the derivations and the
word matching every client relies on.
"""

from __future__ import annotations

import pytest

from meshctl import kinds as client_kinds
from meshplane import kinds_contract as kc
from meshplane.kinds_contract import Kind
from mgmt_api import fqn as fqnmod
from mgmt_api.console.policy_kinds import POLICY_PAGES
from mgmt_api.domain import rbac
from mgmt_api.kinds import KINDS
from mgmt_api.service.audit import AuditFilters


@pytest.mark.parametrize(
    ("word", "kind"),
    [
        ("User", Kind.USER),
        ("user", Kind.USER),
        ("USERS", Kind.USER),
        ("btp", Kind.BACKEND_TRAFFIC_POLICY),
        ("BackendTrafficPolicies", Kind.BACKEND_TRAFFIC_POLICY),
        ("httproute", Kind.HTTP_ROUTE),
        ("Routes", Kind.HTTP_ROUTE),
        ("sa", Kind.SERVICE_ACCOUNT),
        ("securityGroups", Kind.SECURITY_GROUP),
        ("onboarding", Kind.CLUSTER_ONBOARDING_CONFIG),
        ("settings", Kind.SECURITY_SETTING),
        (" Org ", Kind.ORGANIZATION),
        ("accesspolicy", None),  # a policy, not a CRUD kind: is_policy_word
        ("approvals", None),  # the one non-CRUD kind has its own commands
        ("widget", None),
    ],
)
def test_kind_words_are_matched_case_insensitively_by_name_plural_collection_and_alias(
    word: str, kind: Kind | None
) -> None:
    shape = kc.lookup(word)
    assert (shape.kind if shape else None) == kind


@pytest.mark.parametrize("word", ["AccessPolicy", "accesspolicy", "Policies", "policy"])
def test_policy_words(word: str) -> None:
    assert kc.is_policy_word(word) and kc.lookup(word) is None


def test_no_word_names_two_kinds() -> None:
    seen: dict[str, Kind] = {}
    for shape in kc.CRUD_KINDS:
        for word in shape.words():
            assert seen.setdefault(word, shape.kind) == shape.kind, word
            assert not kc.is_policy_word(word), word


def test_the_fqn_grammar_is_the_table() -> None:
    for shape in kc.SHAPES.values():
        for parent in shape.parents:
            assert fqnmod.CHILDREN[parent][shape.collection] == shape.kind
    assert {"backendtrafficpolicies", "httproutes", "backends"} == fqnmod.NAMESPACED
    assert fqnmod.parse("organizations/o/clusters/c/approvals/policy").kind == (
        Kind.APPROVAL_POLICY
    )


def test_every_crud_kind_has_one_implementation_and_the_exception_is_documented() -> None:
    assert set(KINDS) == {s.kind for s in kc.CRUD_KINDS}
    assert {Kind.APPROVAL_POLICY} == kc.NOT_CRUD
    for kind, kdef in KINDS.items():
        assert (kdef.collection, kdef.parents) == (
            kc.SHAPES[Kind(kind)].collection,
            kc.SHAPES[Kind(kind)].parents,
        )


@pytest.mark.parametrize(
    ("kind", "chains"),
    [
        (Kind.ORGANIZATION, {()}),
        (Kind.WORKSPACE, {(Kind.ORGANIZATION, Kind.TENANT)}),
        (Kind.USER, {(Kind.ORGANIZATION,), ()}),
        (Kind.ROLE, {()}),
        (
            Kind.PROFILE,
            {
                (Kind.ORGANIZATION,),
                (Kind.ORGANIZATION, Kind.TENANT),
                (Kind.ORGANIZATION, Kind.TENANT, Kind.WORKSPACE),
            },
        ),
    ],
)
def test_parent_chains(kind: Kind, chains: set[tuple[Kind, ...]]) -> None:
    assert set(kc.chains(kind)) == chains
    assert set(client_kinds.KINDS[kind].chains) == chains


def test_the_console_reads_paths_from_the_table() -> None:
    for page in POLICY_PAGES.values():
        shape = kc.SHAPES[page.kind]
        assert (page.collection, page.body_field, page.list_field) == (
            shape.collection,
            shape.body_field,
            shape.list_field,
        )


def test_binding_subjects_name_their_kinds() -> None:
    assert kc.SUBJECT_KINDS == {
        "user": Kind.USER,
        "team": Kind.TEAM,
        "serviceAccount": Kind.SERVICE_ACCOUNT,
    }


@pytest.mark.parametrize(
    ("word", "stored"),
    [("btp", "BackendTrafficPolicy"), ("user", "User"), ("CleanupResources", "CleanupResources")],
)
def test_the_audit_kind_filter_takes_any_kind_word(word: str, stored: str) -> None:
    assert AuditFilters(kind=word).as_store_filters() == {"kind": stored}


A, B = "organizations/o/users/a", "organizations/o/users/b"
T = "organizations/o/teams/t"


@pytest.mark.parametrize(
    ("allow", "gone", "left"),
    [
        ([{"role": "r", "subjects": [{"user": A}, {"user": B}]}], {A},
         [{"role": "r", "subjects": [{"user": B}]}]),
        ([{"role": "r", "subjects": [{"user": A}]}, {"role": "s", "subjects": [{"team": T}]}],
         {A}, [{"role": "s", "subjects": [{"team": T}]}]),
        ([{"role": "r", "subjects": []}], {A}, [{"role": "r", "subjects": []}]),
        ([{"role": "r", "subjects": [{"team": T}]}], {A},
         [{"role": "r", "subjects": [{"team": T}]}]),
    ],
)  # fmt: skip
def test_without_subjects(
    allow: list[dict[str, object]], gone: set[str], left: list[dict[str, object]]
) -> None:
    assert rbac.without_subjects(allow, gone) == left  # type: ignore[arg-type]
