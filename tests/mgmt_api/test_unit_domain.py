"""Pure domain logic, table-tested: FQNs, RBAC resolution, durations, paging.

Login throttling and the client address: tests/mgmt_api/test_login_rules.py.
"""

from __future__ import annotations

import pytest

from mgmt_api import fqn
from mgmt_api.domain import listing, rbac
from mgmt_api.domain.durations import format_duration, parse_duration, shortest_duration
from mgmt_api.errors import ApiError, Code
from mgmt_api.kinds import KINDS


@pytest.mark.parametrize(
    ("value", "kind", "parent"),
    [
        ("organizations/o", "Organization", ""),
        ("organizations/o/clusters/c", "Cluster", "organizations/o"),
        ("organizations/o/tenants/t/workspaces/w", "Workspace", "organizations/o/tenants/t"),
        (
            "organizations/o/tenants/t/workspaces/w/securitygroups/g",
            "SecurityGroup",
            "organizations/o/tenants/t/workspaces/w",
        ),
        ("organizations/o/users/u", "User", "organizations/o"),
        ("organizations/o/teams/t", "Team", "organizations/o"),
        ("organizations/o/serviceaccounts/s", "ServiceAccount", "organizations/o"),
        (
            "organizations/o/clusters/c/serviceaccounts/agent",
            "ServiceAccount",
            "organizations/o/clusters/c",
        ),
        ("users/admin", "User", ""),
        ("rbac/admin", "Role", "rbac"),
    ],
)
def test_parse_valid(value: str, kind: str, parent: str) -> None:
    parsed = fqn.parse(value)
    assert (parsed.kind, parsed.parent, parsed.name) == (kind, parent, value.rsplit("/", 1)[1])


@pytest.mark.parametrize(
    "value",
    [
        "",
        "organizations",
        "organizations/O",
        "organizations/o/workspaces/w",
        "organizations/o/tenants",
        "tenants/t",
        "organizations/o/clusters/c/tenants/t",
        "rbac/a/b",
        "rbac",
        "organizations/-x",
        "organizations/" + "a" * 64,
    ],
)
def test_parse_invalid_names_the_field(value: str) -> None:
    with pytest.raises(ApiError) as info:
        fqn.parse(value, "parent")
    assert info.value.code is Code.INVALID_ARGUMENT and info.value.message.startswith("parent")


def test_grammar_matches_kind_registry() -> None:
    for kdef in KINDS.values():
        for parent in kdef.parents:
            if parent != fqn.RBAC_KIND:
                assert fqn.CHILDREN[parent][kdef.collection] == kdef.kind


def test_ancestors_and_subtree_bounds() -> None:
    assert fqn.ancestors("organizations/o/clusters/c") == [
        "",
        "organizations/o",
        "organizations/o/clusters/c",
    ]
    assert fqn.ancestors("rbac/r") == ["", "rbac", "rbac/r"]
    lo, hi = fqn.subtree_bounds("organizations/o")
    inside = ["organizations/o/tenants/t", "organizations/o/a"]
    outside = [
        "organizations/o",
        "organizations/o-b/tenants/t",
        "organizations/oa",
        "organizations/p",
    ]
    assert all(lo < f < hi for f in inside)
    assert not any(lo < f < hi for f in outside)


U, T = "organizations/o/users/u", "organizations/o/teams/ops"


@pytest.mark.parametrize(
    ("policies", "subjects", "kind", "expected"),
    [
        ([[{"role": "rbac/reader", "subjects": [{"user": U}]}]], {U}, "Cluster", {"READ"}),
        ([[{"role": "rbac/reader", "subjects": [{"user": "x"}]}]], {U}, "Cluster", set()),
        (
            [
                [{"role": "rbac/reader", "subjects": [{"team": T}]}],
                [{"role": "rbac/writer", "subjects": [{"user": U}]}],
            ],
            {U, T},
            "Cluster",
            {"READ", "WRITE"},
        ),
        (
            [[{"role": "rbac/admin", "subjects": [{"user": U}]}]],
            {U},
            "Tenant",
            set(rbac.ALL_PERMISSIONS),
        ),
        ([[{"role": "rbac/custom", "subjects": [{"user": U}]}]], {U}, "Cluster", {"DELETE"}),
        ([[{"role": "rbac/custom", "subjects": [{"user": U}]}]], {U}, "Tenant", set()),
        ([[{"role": "rbac/gone", "subjects": [{"user": U}]}]], {U}, "Cluster", set()),
    ],
)
def test_effective_permissions(
    policies: list[list[rbac.StoredBinding]], subjects: set[str], kind: str, expected: set[str]
) -> None:
    roles = dict(rbac.BUILTIN_ROLES)
    roles["rbac/custom"] = rbac.rules_from_spec(
        {"rules": [{"types": [{"kinds": ["Cluster"]}], "permissions": ["DELETE"]}]}
    )
    assert rbac.effective_permissions(policies, frozenset(subjects), roles, kind) == expected


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("3600s", 3600), ("1h", 3600), ("1h30m", 5400), ("0.5s", 0.5), ("250ms", 0.25)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, "f") == seconds


@pytest.mark.parametrize("text", ["", "1d", "-1s", "0s", "s", "1h x"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ApiError):
        parse_duration(text, "f")


def test_format_duration() -> None:
    assert format_duration(3600) == "3600s" and format_duration(0.5) == "0.5s"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(30 * 86400.0, "720h"), (300.0, "5m"), (90.0, "90s"), (10.0, "10s"), (0.5, "0.5s")],
)
def test_shortest_duration_reads_back(seconds: float, text: str) -> None:
    assert shortest_duration(seconds) == text
    assert parse_duration(text, "f") == seconds


def test_page_tokens_and_selectors() -> None:
    token = listing.encode_token("organizations/o/clusters/c")
    assert listing.decode_token(token) == "organizations/o/clusters/c"
    for bad in ("!!!", "€", "a"):
        with pytest.raises(ApiError):
            listing.decode_token(bad)
    sel = listing.parse_selector("env=prod, tier")
    assert sel == [("env", "prod"), ("tier", None)]
    assert listing.matches({"env": "prod", "tier": "1"}, sel)
    assert not listing.matches({"env": "dev", "tier": "1"}, sel)
    assert not listing.matches(None, sel)
