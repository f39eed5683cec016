"""Profiles (spec §4.6): where they may be used, what is available, and blame.

Blame order: the profiles of the organization, then the tenant, then the
workspace, each level's in listed order (a profile's defaults, then its
mandates), then the object's own value. Defaults are overridden by anything
later; mandates by nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from mgmt_api.domain.blame import Layer, Section, Source, blame, usable_at
from tests.mgmt_api.harness import err, ok

# ---- the pure blame function -----------------------------------------------------


def _layer(fqn: str, section: Section, settings: dict[str, Any]) -> Layer:
    kind = "RESOURCE" if section is Section.OWN else "PROFILE"
    return Layer(Source(fqn, kind, section), settings)


def _effective(layers: list[Layer]) -> dict[str, tuple[Any, str, str]]:
    return {e.path: (e.value, e.source.fqn, e.source.section.value) for e in blame(layers)}


def test_later_defaults_and_the_own_value_override_earlier_defaults() -> None:
    got = _effective(
        [
            _layer("p1", Section.DEFAULTS, {"a": 1, "b": {"c": 1}, "d": 1}),
            _layer("p2", Section.DEFAULTS, {"a": 2, "b": {"c": 2}}),
            _layer("obj", Section.OWN, {"a": 3}),
        ]
    )
    assert got == {"a": (3, "obj", "OWN"), "b.c": (2, "p2", "DEFAULTS"), "d": (1, "p1", "DEFAULTS")}


def test_a_mandate_beats_earlier_defaults_and_everything_after_it() -> None:
    entries = blame(
        [
            _layer("p1", Section.DEFAULTS, {"a": 1}),
            _layer("p1", Section.MANDATES, {"a": 2}),
            _layer("p2", Section.MANDATES, {"a": 3}),
            _layer("p3", Section.DEFAULTS, {"a": 4}),
            _layer("obj", Section.OWN, {"a": 5}),
        ]
    )
    assert [(e.path, e.value, e.source.fqn, e.source.section) for e in entries] == [
        ("a", 2, "p1", Section.MANDATES)
    ]
    assert [(v, s.fqn) for v, s in entries[0].shadowed] == [
        (1, "p1"),
        (3, "p2"),
        (4, "p3"),
        (5, "obj"),
    ]


def test_a_mandate_cannot_be_escaped_through_a_parent_or_child_path() -> None:
    got = _effective(
        [
            _layer("p1", Section.MANDATES, {"traffic": {"timeout": "1s"}}),
            _layer("obj", Section.OWN, {"traffic": "off", "other": {"x": [1, 2]}}),
        ]
    )
    assert got == {
        "traffic.timeout": ("1s", "p1", "MANDATES"),
        "other.x": ([1, 2], "obj", "OWN"),
    }
    replaced = _effective(
        [
            _layer("p1", Section.DEFAULTS, {"traffic": {"timeout": "1s", "retries": 3}}),
            _layer("obj", Section.OWN, {"traffic": "off"}),
        ]
    )
    assert replaced == {"traffic": ("off", "obj", "OWN")}


def test_a_profile_is_usable_at_its_level_and_below_only() -> None:
    org, tenant = "organizations/o", "organizations/o/tenants/t"
    workspace = f"{tenant}/workspaces/w"
    assert usable_at(f"{org}/profiles/p", workspace)
    assert usable_at(f"{tenant}/profiles/p", tenant)
    assert not usable_at(f"{tenant}/profiles/p", org)
    assert not usable_at(f"{workspace}/profiles/p", tenant)
    assert not usable_at("organizations/other/profiles/p", workspace)


# ---- over REST ----------------------------------------------------------------------


@pytest.fixture
def tree(admin: httpx.Client, org: str) -> str:
    """organizations/{org} with tenant t, workspace w and cluster c; returns the org FQN."""
    base = f"/v2/organizations/{org}"
    ok(admin.post(f"{base}/tenants", json={"name": "t", "tenant": {}}))
    selector = {"namespaceSelector": {"names": ["c/ns"]}}
    ok(admin.post(f"{base}/tenants/t/workspaces", json={"name": "w", "workspace": selector}))
    ok(admin.post(f"{base}/clusters", json={"name": "c", "cluster": {"network": "own-net"}}))
    return f"organizations/{org}"


def profile(admin: httpx.Client, parent: str, name: str, **spec: Any) -> str:
    ok(admin.post(f"/v2/{parent}/profiles", json={"name": name, "profile": spec}))
    return f"{parent}/profiles/{name}"


def attach(admin: httpx.Client, fqn: str, *profiles: str, **own: Any) -> httpx.Response:
    current = ok(admin.get(f"/v2/{fqn}"))
    return admin.put(f"/v2/{fqn}", json={**current, **own, "profiles": list(profiles)})


def effective(admin: httpx.Client, fqn: str) -> dict[str, tuple[Any, str, str]]:
    answer = ok(admin.get(f"/v2/{fqn}/blame"))
    assert answer["fqn"] == fqn
    return {
        e["path"]: (e["value"], e["source"]["fqn"], e["source"]["section"])
        for e in answer["entries"]
    }


def test_profile_settings_must_be_objects(admin: httpx.Client, tree: str) -> None:
    err(
        admin.post(f"/v2/{tree}/profiles", json={"name": "p", "profile": {"defaults": 5}}),
        400,
        "INVALID_ARGUMENT",
    )
    made = ok(admin.get(f"/v2/{profile(admin, tree, 'p', mandates={'a': {'b': 1}})}"))
    assert made["mandates"] == {"a": {"b": 1}}


def test_profiles_must_exist_and_be_usable_at_the_level(admin: httpx.Client, tree: str) -> None:
    tenant, workspace = f"{tree}/tenants/t", f"{tree}/tenants/t/workspaces/w"
    on_org, on_tenant = profile(admin, tree, "po"), profile(admin, tenant, "pt")

    ok(attach(admin, workspace, on_org, on_tenant))  # created higher: usable lower
    body = err(attach(admin, tree, on_tenant), 400, "INVALID_ARGUMENT")
    assert "organization.profiles[0]" in body["message"] and "not usable" in body["message"]
    body = err(attach(admin, tenant, on_org, f"{tree}/profiles/nope"), 400, "INVALID_ARGUMENT")
    assert "tenant.profiles[1]" in body["message"] and "does not exist" in body["message"]
    err(attach(admin, tenant, on_org, on_org), 400, "INVALID_ARGUMENT")
    err(attach(admin, tenant, f"{tree}/clusters/c"), 400, "INVALID_ARGUMENT")
    created = admin.post(
        f"/v2/{tenant}/workspaces",
        json={
            "name": "w2",
            "workspace": {
                "namespaceSelector": {"names": ["*/*"]},
                "profiles": [f"{tenant}/profiles/x"],
            },
        },
    )
    err(created, 400, "INVALID_ARGUMENT")


def test_available_profiles_are_those_of_the_level_and_above(
    admin: httpx.Client, tree: str
) -> None:
    tenant, workspace = f"{tree}/tenants/t", f"{tree}/tenants/t/workspaces/w"
    on_org = profile(admin, tree, "po", displayName="Org P", description="from the org")
    on_tenant = profile(admin, tenant, "pt")
    on_ws = profile(admin, workspace, "pw")

    def available(fqn: str) -> list[tuple[str, str, str, str]]:
        listed = ok(admin.get(f"/v2/{fqn}/availableprofiles"))["profiles"]
        return [(p["fqn"], p["displayName"], p["description"], p["level"]) for p in listed]

    assert available(tree) == [(on_org, "Org P", "from the org", "ORGANIZATION")]
    assert [p[0] for p in available(tenant)] == [on_org, on_tenant]
    assert [(p[0], p[3]) for p in available(workspace)] == [
        (on_org, "ORGANIZATION"),
        (on_tenant, "TENANT"),
        (on_ws, "WORKSPACE"),
    ]


def test_blame_follows_the_hierarchy_and_listed_order(admin: httpx.Client, tree: str) -> None:
    tenant, workspace = f"{tree}/tenants/t", f"{tree}/tenants/t/workspaces/w"
    org1 = profile(admin, tree, "org1", defaults={"traffic": {"timeout": "1s", "retries": 1}})
    org2 = profile(
        admin,
        tree,
        "org2",
        defaults={"traffic": {"retries": 2}},
        mandates={"securityDomain": "org-domain"},
    )
    ten = profile(admin, tenant, "ten", defaults={"traffic": {"timeout": "3s"}, "waf": "on"})
    ws = profile(
        admin, workspace, "ws", defaults={"waf": "off"}, mandates={"traffic": {"retries": 9}}
    )
    ok(attach(admin, tree, org2, org1))  # listed order: org2 first, then org1
    ok(attach(admin, tenant, ten))
    ok(attach(admin, workspace, ws, securityDomain="mine", privileged=True))

    got = effective(admin, workspace)
    assert got["traffic.timeout"] == ("3s", ten, "DEFAULTS")  # tenant after organization
    assert got["traffic.retries"] == (9, ws, "MANDATES")  # mandate beats earlier defaults
    assert got["waf"] == ("off", ws, "DEFAULTS")  # workspace after tenant
    assert got["securityDomain"] == ("org-domain", org2, "MANDATES")  # own value cannot win
    assert got["privileged"] == (True, workspace, "OWN")
    answer = ok(admin.get(f"/v2/{workspace}/blame"))
    assert answer["profiles"] == [org2, org1, ten, ws]
    shadowed = next(e for e in answer["entries"] if e["path"] == "securityDomain")["shadowed"]
    assert [(s["value"], s["source"]["fqn"]) for s in shadowed] == [("mine", workspace)]

    # org1 is listed after org2, so its default wins within the organization.
    assert effective(admin, tree)["traffic.retries"] == (1, org1, "DEFAULTS")


def test_cluster_blame_is_the_organizations_profiles_then_the_cluster(
    admin: httpx.Client, tree: str
) -> None:
    cluster = f"{tree}/clusters/c"
    p = profile(
        admin,
        tree,
        "p",
        defaults={"network": "default-net", "trustDomain": "td.example"},
        mandates={"tier1Cluster": False},
    )
    ok(attach(admin, tree, p))
    ok(admin.put(f"/v2/{cluster}", json={**ok(admin.get(f"/v2/{cluster}")), "tier1Cluster": True}))

    got = effective(admin, cluster)
    assert got["network"] == ("own-net", cluster, "OWN")
    assert got["trustDomain"] == ("td.example", p, "DEFAULTS")
    assert got["tier1Cluster"] == (False, p, "MANDATES")
    assert got["tokenTtl"] == ("3600s", cluster, "OWN")


def test_cluster_config_applies_what_blame_shows(admin: httpx.Client, tree: str) -> None:
    """``POST .../config``, which control planes sync from, carries the effective
    settings: an organization's mandate wins over the cluster's own value, a
    default fills what the cluster leaves unset."""
    cluster = f"{tree}/clusters/c"
    p = profile(
        admin,
        tree,
        "p",
        defaults={"trustDomain": "td.example"},
        mandates={"network": "mandated-net"},
    )
    ok(attach(admin, tree, p))
    config = ok(admin.post(f"/v2/{cluster}/config"))
    assert effective(admin, cluster)["network"] == ("mandated-net", p, "MANDATES")
    assert config["network"] == "mandated-net"  # not the cluster's own "own-net"
    assert config["trustDomain"] == "td.example"
    assert config["tokenTtl"] == "3600s"


def test_blame_reports_attached_profiles_that_were_deleted(admin: httpx.Client, tree: str) -> None:
    p = profile(admin, tree, "gone", defaults={"x": 1})
    ok(attach(admin, tree, p))
    ok(admin.delete(f"/v2/{p}"))
    answer = ok(admin.get(f"/v2/{tree}/blame"))
    assert answer["missingProfiles"] == [p]
    assert "x" not in {e["path"] for e in answer["entries"]}


ENDPOINTS = [
    ("{o}", "blame"),
    ("{o}", "availableprofiles"),
    ("{o}/tenants/t", "blame"),
    ("{o}/tenants/t", "availableprofiles"),
    ("{o}/tenants/t/workspaces/w", "blame"),
    ("{o}/tenants/t/workspaces/w", "availableprofiles"),
    ("{o}/clusters/c", "blame"),
]


@pytest.mark.parametrize(("target", "endpoint"), ENDPOINTS)
def test_profile_endpoints_need_read_on_the_object(
    admin: httpx.Client,
    server: Any,
    tree: str,
    make_user: Callable[..., httpx.Client],
    target: str,
    endpoint: str,
) -> None:
    fqn = target.format(o=tree)
    path = f"/v2/{fqn}/{endpoint}"
    with server.client() as anonymous:
        err(anonymous.get(path), 401, "UNAUTHENTICATED")
    org = tree.split("/")[1]
    with make_user(org) as nobody:
        body = err(nobody.get(path), 403, "PERMISSION_DENIED")
        assert fqn in body["message"]
    reader_client = make_user(org, "reader")
    policy = ok(admin.get(f"/v2/{fqn}/policy"))
    allow = [
        *policy["allow"],
        {"role": "rbac/reader", "subjects": [{"user": f"{tree}/users/reader"}]},
    ]
    ok(admin.put(f"/v2/{fqn}/policy", json={"etag": policy["etag"], "allow": allow}))
    with reader_client:
        ok(reader_client.get(path))
