"""Cleanup: unused objects found with reasons, dry run by default, same set applied."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from mgmt_api.auth import keys as keymod
from mgmt_api.store import repo
from mgmt_api.store.engine import create_engine, read_tx, write_tx
from tests.mgmt_api.agents import agent, create_cluster, namespace, report, tuned_server
from tests.mgmt_api.harness import MgmtServer, err, ok, unique
from tests.mgmt_api.rbac_helpers import grant

ON, OFF = "DESIRED_ONBOARDED", "DESIRED_OFFBOARDED"


def _post(admin: httpx.Client, path: str, name: str, field: str, spec: dict[str, Any]) -> str:
    return str(ok(admin.post(f"/v2/{path}", json={"name": name, field: spec}))["fqn"])


def _keys_of(server: MgmtServer, owner: str) -> list[str]:
    engine = create_engine(server.database_url)
    try:
        with read_tx(engine) as conn:
            return [key_id for key_id, _, _ in repo.keys_of(conn, owner)]
    finally:
        engine.dispose()


def _orphan_key(server: MgmtServer, org: str) -> str:
    """A key left behind by a cluster that no longer exists (as an old release or a
    restore could leave it): written straight into the store, since the API revokes
    keys together with their cluster."""
    owner = f"organizations/{org}/clusters/gone/serviceaccounts/agent"
    pair = keymod.generate()
    engine = create_engine(server.database_url)
    try:
        with write_tx(engine) as conn:
            repo.add_key(conn, pair.id, owner, pair.public_jwk)
    finally:
        engine.dispose()
    return f"{owner}/keys/{pair.id}"


@pytest.fixture
def world(server: MgmtServer, admin: httpx.Client, org: str) -> dict[str, str]:
    """An organization with used and unused objects of every category."""
    o = f"organizations/{org}"
    east = create_cluster(admin, org, "east")
    with agent(server, east) as a:
        ok(report(a, east, namespace("shop", "cart")))
    # onboarded, then offboarded: the onboarding tenant and workspace are left empty
    base = f"{east['fqn']}/onboarding"
    _post(admin, base, "c", "config", {"namespaces": [{"name": "shop", "desiredState": ON}]})
    cfg = ok(admin.get(f"/v2/{base}/c"))
    cfg["namespaces"][0]["desiredState"] = OFF
    ok(admin.put(f"/v2/{base}/c", json=cfg))

    used = _post(admin, f"{o}/profiles", "used", "profile", {})
    ok(admin.put(f"/v2/{o}", json={**ok(admin.get(f"/v2/{o}")), "profiles": [used]}))
    tenant = _post(admin, f"{o}/tenants", "t", "tenant", {})
    ws = _post(
        admin,
        f"{tenant}/workspaces",
        "w",
        "workspace",
        {"namespaceSelector": {"names": ["east/shop"]}},
    )
    return {
        "o": o,
        "used_profile": used,
        "unused_profile": _post(admin, f"{tenant}/profiles", "spare", "profile", {}),
        "kept_profile": _post(
            admin, f"{ws}/profiles", "kept", "profile", {"deletionProtectionEnabled": True}
        ),
        "used_group": _post(admin, f"{ws}/securitygroups", "inherits", "securityGroup", {}),
        "unused_group": _post(
            admin,
            f"{ws}/securitygroups",
            "west",
            "securityGroup",
            {"namespaceSelector": {"names": ["west/*"]}},
        ),
        "kept_group": _post(
            admin,
            f"{ws}/securitygroups",
            "guarded",
            "securityGroup",
            {"namespaceSelector": {"names": ["*/payments"]}, "deletionProtectionEnabled": True},
        ),
        "onboarding_tenant": f"{o}/tenants/onboarding",
        "onboarding_workspace": f"{o}/tenants/onboarding/workspaces/onboarding",
        "orphan_key": _orphan_key(server, org),
    }


def _run(client: httpx.Client, org_fqn: str, **body: bool) -> dict[str, Any]:
    result: dict[str, Any] = ok(client.post(f"/v2/{org_fqn}/cleanupresources", json=body))
    return result


def test_dry_run_lists_what_apply_deletes(
    server: MgmtServer, admin: httpx.Client, world: dict[str, str]
) -> None:
    o = world["o"]
    dry = _run(admin, o)
    assert dry["apply"] is False
    assert {c["fqn"]: c["kind"] for c in dry["changes"]} == {
        world["onboarding_tenant"]: "Tenant",
        world["onboarding_workspace"]: "Workspace",
        world["unused_profile"]: "Profile",
        world["unused_group"]: "SecurityGroup",
        world["orphan_key"]: "ServiceAccountKey",
    }
    assert all(c["reason"] for c in dry["changes"])
    assert {s["fqn"] for s in dry["skipped"]} == {world["kept_profile"], world["kept_group"]}
    assert all("deletionProtectionEnabled" in s["reason"] for s in dry["skipped"])
    # a dry run changes nothing, and says so again
    for fqn in (world["onboarding_workspace"], world["unused_profile"], world["unused_group"]):
        ok(admin.get(f"/v2/{fqn}"))
    owner, _, key_id = world["orphan_key"].rpartition("/keys/")
    assert _keys_of(server, owner) == [key_id]
    assert _run(admin, o, apply=False) == dry

    applied = _run(admin, o, apply=True)
    assert applied["apply"] is True
    assert applied["changes"] == dry["changes"] and applied["skipped"] == dry["skipped"]
    for fqn in (world["onboarding_tenant"], world["unused_profile"], world["unused_group"]):
        err(admin.get(f"/v2/{fqn}"), 404)
    for key in ("used_profile", "kept_profile", "used_group", "kept_group"):
        ok(admin.get(f"/v2/{world[key]}"))
    assert _keys_of(server, owner) == []

    again = _run(admin, o)
    assert again["changes"] == [] and again["skipped"] == dry["skipped"]
    logs = ok(admin.get(f"/v2/{o}/auditlogs", params={"pageSize": 100}))["auditLogs"]
    summary = [a for a in logs if a["operation"] == "CLEANUP_RESOURCES"]
    assert len(summary) == 1
    assert sorted(summary[0]["properties"]["deleted"]) == [c["fqn"] for c in dry["changes"]]
    assert {a["fqn"] for a in logs if a["operation"] == "CLEANUP"} == {
        c["fqn"] for c in dry["changes"]
    }


def test_onboarding_objects_in_use_or_holding_objects_stay(
    server: MgmtServer, admin: httpx.Client, org: str
) -> None:
    o = f"organizations/{org}"
    east = create_cluster(admin, org, "east")
    base = f"{east['fqn']}/onboarding"
    _post(admin, base, "c", "config", {"namespaces": [{"name": "shop", "desiredState": ON}]})
    ws = f"{o}/tenants/onboarding/workspaces/onboarding"
    ok(admin.get(f"/v2/{ws}"))
    with agent(server, east) as a:
        ok(report(a, east, namespace("shop")))
    assert _run(admin, o) == {"apply": False, "changes": [], "skipped": []}

    # offboarded, but an admin put a security group (which selects shop) in the workspace
    _post(admin, f"{ws}/securitygroups", "g", "securityGroup", {})
    cfg = ok(admin.get(f"/v2/{base}/c"))
    ok(admin.put(f"/v2/{base}/c", json={**cfg, "namespaces": []}))
    applied = _run(admin, o, apply=True)
    skipped = {s["fqn"]: s["reason"] for s in applied["skipped"]}
    assert set(skipped) == {ws, f"{o}/tenants/onboarding"}
    assert all("holds objects" in r for r in skipped.values())
    # the group selects nothing now: its workspace selects only the empty placeholder
    assert [c["fqn"] for c in applied["changes"]] == [f"{ws}/securitygroups/g"]
    ok(admin.get(f"/v2/{ws}"))
    assert [c["fqn"] for c in _run(admin, o, apply=True)["changes"]] == [
        f"{o}/tenants/onboarding",
        ws,
    ]


def test_cleanup_has_its_own_permission(
    server: MgmtServer,
    admin: httpx.Client,
    world: dict[str, str],
    make_user: Callable[..., httpx.Client],
) -> None:
    o = world["o"]
    org = o.split("/")[1]
    path = f"/v2/{o}/cleanupresources"
    with server.client() as anonymous:
        err(anonymous.post(path, json={}), 401, "UNAUTHENTICATED")
    name = unique("u")
    user_fqn = f"{o}/users/{name}"
    role = unique("cleaner")
    ok(
        admin.post(
            "/v2/rbac",
            json={
                "name": role,
                "role": {
                    "rules": [
                        {
                            "types": [{"kinds": ["CleanupResources"]}],
                            "permissions": ["READ", "DELETE"],
                        }
                    ]
                },
            },
        )
    )
    with make_user(org, name) as user:
        err(user.post(path, json={}), 403, "PERMISSION_DENIED")
        grant(admin, o, "rbac/reader", {"user": user_fqn})
        dry = ok(user.post(path, json={}))  # READ: the dry run
        denied = err(user.post(path, json={"apply": True}), 403, "PERMISSION_DENIED")
        assert "DELETE" in denied["message"] and "CleanupResources" in denied["message"]
        grant(admin, o, f"rbac/{role}", {"user": user_fqn})
        # the cleanup role deletes through cleanup only, not directly
        err(user.delete(f"/v2/{world['unused_profile']}"), 403)
        assert ok(user.post(path, json={"apply": True}))["changes"] == dry["changes"]
    err(admin.post(f"/v2/organizations/{unique('none')}/cleanupresources", json={}), 404)
    err(admin.post(path, json={"apply": "maybe"}), 400)


EXTAUTHZ_POLICY = {
    "jwt": {
        "algorithms": ["HS256"],
        "keys": [{"hmacSecret": {"value": "a-long-test-secret-of-32-bytes-or-more"}}],
    },
    "pathClaim": {"name": "path", "match": "PREFIX"},
}
SETTING = {
    "authorization": {
        "mode": "CLUSTER",
        "http": {"external": {"uri": "grpc://extauthz.mesh:9191", "policy": "jwt"}},
    }
}


def _workspace(admin: httpx.Client, org: str, *names: str) -> str:
    tenant = _post(admin, f"organizations/{org}/tenants", "t", "tenant", {})
    return _post(
        admin, f"{tenant}/workspaces", "w", "workspace", {"namespaceSelector": {"names": names}}
    )


def _group(admin: httpx.Client, ws: str, name: str, *names: str, **spec: object) -> str:
    if names:
        spec["namespaceSelector"] = {"names": list(names)}
    return _post(admin, f"{ws}/securitygroups", name, "securityGroup", spec)


def test_groups_holding_settings_or_policies_are_skipped_not_emptied(
    server: MgmtServer, admin: httpx.Client, org: str
) -> None:
    """The recursive delete would take a group's SecuritySettings and
    ExtAuthzPolicies along unannounced: such a group is reported, never deleted."""
    o = f"organizations/{org}"
    ws = _workspace(admin, org, "gone/*")
    full = _group(admin, ws, "full")
    setting = _post(admin, f"{full}/settings", "s", "securitySetting", SETTING)
    policy = _post(admin, f"{full}/extauthzpolicies", "jwt", "extAuthzPolicy", EXTAUTHZ_POLICY)
    empty = _group(admin, ws, "empty")

    dry = _run(admin, o)
    assert [c["fqn"] for c in dry["changes"]] == [empty]
    [held] = dry["skipped"]
    assert held["fqn"] == full
    assert "holds objects (2: ExtAuthzPolicy, SecuritySetting)" in held["reason"]
    applied = _run(admin, o, apply=True)
    assert applied["changes"] == dry["changes"] and applied["skipped"] == dry["skipped"]
    for fqn in (full, setting, policy):
        ok(admin.get(f"/v2/{fqn}"))
    err(admin.get(f"/v2/{empty}"), 404)


def test_protection_anywhere_below_a_candidate_skips_it(
    server: MgmtServer, admin: httpx.Client, org: str
) -> None:
    o = f"organizations/{org}"
    east = create_cluster(admin, org, "east")
    base = f"{east['fqn']}/onboarding"
    _post(admin, base, "c", "config", {"namespaces": [{"name": "shop", "desiredState": ON}]})
    ws = f"{o}/tenants/onboarding/workspaces/onboarding"
    guarded = _group(admin, ws, "g", deletionProtectionEnabled=True)
    cfg = ok(admin.get(f"/v2/{base}"))["configs"][0]
    ok(admin.put(f"/v2/{base}/c", json={**cfg, "namespaces": []}))

    result = _run(admin, o, apply=True)
    assert result["changes"] == []
    skipped = {s["fqn"]: s["reason"] for s in result["skipped"]}
    assert set(skipped) == {guarded, ws, f"{o}/tenants/onboarding"}
    assert skipped[guarded].endswith("skipped: it has deletionProtectionEnabled")
    # the containers name what is protected below them
    assert f"skipped: {guarded} has deletionProtectionEnabled" in skipped[ws]
    assert f"skipped: {guarded} has deletionProtectionEnabled" in skipped[f"{o}/tenants/onboarding"]
    ok(admin.get(f"/v2/{guarded}"))


def test_groups_naming_clusters_without_a_report_are_unknown(
    server: MgmtServer, admin: httpx.Client, org: str
) -> None:
    """A cluster whose agent never reported makes every selector naming it look
    unused; such groups are skipped with the reason until the agent reports."""
    o = f"organizations/{org}"
    north = create_cluster(admin, org, "north")
    ws = _workspace(admin, org, "north/*")
    named = _group(admin, ws, "named", "north/shop")
    wild = _group(admin, ws, "wild", "*/shop")
    other = _group(admin, ws, "other", "south/shop")  # no such cluster: unused

    dry = _run(admin, o)
    assert [c["fqn"] for c in dry["changes"]] == [other]
    skipped = {s["fqn"]: s["reason"] for s in dry["skipped"]}
    assert set(skipped) == {named, wild}
    assert all("never reported or are stale" in r and "(north)" in r for r in skipped.values())

    with agent(server, north) as a:
        ok(report(a, north, namespace("web")))
    assert {c["fqn"] for c in _run(admin, o)["changes"]} == {named, wild, other}
    with agent(server, north) as a:
        ok(report(a, north, namespace("shop")))
    assert [c["fqn"] for c in _run(admin, o)["changes"]] == [other]


@pytest.fixture(scope="module")
def impatient() -> Iterator[MgmtServer]:
    """Agents count as stale after one second of silence."""
    with tuned_server(MESHPLANE_AGENT_STALE_AFTER="1s") as srv:
        yield srv


def test_groups_naming_stale_clusters_are_unknown(impatient: MgmtServer) -> None:
    with impatient.admin() as admin:
        org = unique("org")
        ok(admin.post("/v2/organizations", json={"name": org, "organization": {}}))
        east = create_cluster(admin, org, "east")
        ws = _workspace(admin, org, "east/*")
        group = _group(admin, ws, "g", "east/shop")
        with agent(impatient, east) as a:
            ok(report(a, east, namespace("web")))
            fresh = _run(admin, f"organizations/{org}")
            assert [c["fqn"] for c in fresh["changes"]] == [group]
            time.sleep(1.2)  # silent past the threshold: what it listed may be gone or grown
            stale = _run(admin, f"organizations/{org}")
            assert stale["changes"] == []
            assert [s["fqn"] for s in stale["skipped"]] == [group]
            assert "(east)" in stale["skipped"][0]["reason"]
