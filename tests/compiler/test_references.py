"""Dangling references: a policy or route naming an object the cluster does not have.

The pure decision (:func:`mgmt_api.compiler.references.dangling_references`)
as a table, and the kinds it is fed, read off the kind registry.
"""

from __future__ import annotations

from typing import Any

import pytest

from mgmt_api.compiler.references import DanglingReference, Referrer, dangling_references
from mgmt_api.service import references

STORED = {"HTTPRoute": {("shop", "web")}, "Backend": {("shop", "legacy"), ("other", "db")}}


def _policy(target: dict[str, Any], namespace: str = "shop") -> Referrer:
    manifest = {"metadata": {"namespace": namespace, "name": "p"}, "spec": {"targetRef": target}}
    return Referrer("BackendTrafficPolicy", f"c/btp/{namespace}.p", manifest)


def _route(*refs: dict[str, Any], parents: tuple[dict[str, Any], ...] = ()) -> Referrer:
    spec = {"parentRefs": list(parents), "rules": [{"backendRefs": list(refs)}]}
    return Referrer(
        "HTTPRoute", "c/routes/shop.r", {"metadata": {"namespace": "shop"}, "spec": spec}
    )


@pytest.mark.parametrize(
    ("referrer", "expected"),
    [
        (_policy({"kind": "HTTPRoute", "name": "web"}), []),
        (
            _policy({"kind": "HTTPRoute", "name": "ghost"}),
            [("spec.targetRef", "HTTPRoute", "shop", "ghost")],
        ),
        # The namespace is the referrer's: web exists in shop, not in default.
        (
            _policy({"kind": "HTTPRoute", "name": "web"}, "default"),
            [("spec.targetRef", "HTTPRoute", "default", "web")],
        ),
        # A Gateway names itself in its bootstrap; nothing stores it, nothing to check.
        (_policy({"kind": "Gateway", "name": "ghost"}), []),
        (_route({"kind": "Service", "name": "api", "port": 80}), []),
        (_route({"kind": "Backend", "name": "legacy"}), []),
        (_route({"kind": "Backend", "name": "db", "namespace": "other"}), []),
        (
            _route(
                {"kind": "Backend", "name": "legacy"},
                {"kind": "Backend", "name": "gone"},
                parents=({"kind": "Gateway", "name": "gw"},),
            ),
            [("spec.rules[0].backendRefs[1]", "Backend", "shop", "gone")],
        ),
        (Referrer("HTTPRoute", "c/routes/x", {"spec": None}), []),
    ],
)
def test_dangling_references(referrer: Referrer, expected: list[tuple[str, ...]]) -> None:
    got = dangling_references([referrer], STORED)
    assert [(d.field, d.target_kind, d.namespace, d.name) for d in got] == expected
    assert all(d.fqn == referrer.fqn and d.kind == referrer.kind for d in got)


def test_the_message_names_the_object_and_the_missing_target() -> None:
    dangling = DanglingReference(
        "organizations/o/clusters/c/backendtrafficpolicies/default.limit",
        "BackendTrafficPolicy",
        "spec.targetRef",
        "HTTPRoute",
        "default",
        "ghost",
    )
    assert dangling.message.startswith(
        "BackendTrafficPolicy organizations/o/clusters/c/backendtrafficpolicies/default.limit "
        "targets HTTPRoute default/ghost, which does not exist"
    )
    assert dangling.to_json()["targetName"] == "ghost"
    assert dangling.message.endswith("it has no effect until that object is created")


def test_a_missing_backend_says_its_requests_get_503() -> None:
    dangling = DanglingReference(
        "organizations/o/clusters/c/httproutes/default.web",
        "HTTPRoute",
        "spec.rules[0].backendRefs[0]",
        "Backend",
        "default",
        "gone",
    )
    assert dangling.message == (
        "HTTPRoute organizations/o/clusters/c/httproutes/default.web sends traffic to "
        "Backend default/gone, which does not exist in the cluster "
        "(spec.rules[0].backendRefs[0]): the requests it sends there get 503 until that "
        "object is created"
    )


def test_the_kinds_come_from_the_registry() -> None:
    """Every manifest kind of a cluster with a reference field refers; every one can be
    referred to. A new kind with a ``targetRef`` joins without a list to edit."""
    assert references.referring_kinds() == ("BackendTrafficPolicy", "HTTPRoute")
    assert references.checkable_kinds() == ("Backend", "BackendTrafficPolicy", "HTTPRoute")
