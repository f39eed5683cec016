"""Cluster onboarding (spec 2.3, 3, 4.8): configs, the onboarding workspace, status from reports."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest

from mgmt_api.domain import onboarding as ob
from tests.mgmt_api.agents import agent, create_cluster, namespace, report, tuned_server
from tests.mgmt_api.harness import MgmtServer, err, ok, unique
from tests.mgmt_api.rbac_helpers import grant

ON, OFF = "DESIRED_ONBOARDED", "DESIRED_OFFBOARDED"


def config(**states: str) -> dict:
    return {"namespaces": [{"name": n, "desiredState": s} for n, s in states.items()]}


def status(client: httpx.Client, cluster: dict) -> dict[str, dict]:
    body = ok(client.get(f"/v2/{cluster['fqn']}/onboarding/status"))
    return {ns["name"]: ns for ns in body["namespaces"]}


def selector(admin: httpx.Client, org: str) -> list[str]:
    ws = ok(admin.get(f"/v2/organizations/{org}/tenants/onboarding/workspaces/onboarding"))
    names: list[str] = ws["namespaceSelector"]["names"]
    return names


def test_state_table_without_a_server() -> None:
    spec = config(a=ON, b=OFF, c=ON)
    pending = ob.statuses(spec, {}, None, now_us=10)
    assert {n: s["currentState"] for n, s in pending.items()} == dict.fromkeys("abc", "PENDING")
    old_report = ob.Report(frozenset({"a", "b"}), time_us=5)  # sent before the config
    assert ob.statuses(spec, pending, old_report, now_us=11) == pending
    seen = ob.statuses(spec, pending, ob.Report(frozenset({"a", "b"}), time_us=20), now_us=20)
    assert {n: (s["currentState"], s["lastTransitionTime"]) for n, s in seen.items()} == {
        "a": ("ONBOARDED", 20),
        "b": ("OFFBOARDED", 20),
        "c": ("NOT_FOUND_IN_CLUSTER", 20),
    }
    flipped = ob.statuses(config(a=OFF, b=OFF, c=ON), seen, ob.Report(frozenset("ab"), 20), 30)
    assert flipped["a"]["currentState"] == "PENDING" and flipped["b"] == seen["b"]
    assert ob.sync_selector(["*/x", "east/old", "west/w"], "east", ["b", "a"]) == [
        "*/x",
        "west/w",
        "east/a",
        "east/b",
    ]


def test_states_follow_the_agent_reports(server: MgmtServer, admin: httpx.Client, org: str) -> None:
    east = create_cluster(admin, org, "east")
    base = f"/v2/{east['fqn']}/onboarding"
    created = ok(
        admin.post(base, json={"name": "cfg", "config": config(shop=ON, legacy=OFF, ghost=ON)})
    )
    assert created["fqn"] == f"{east['fqn']}/onboarding/cfg"

    # nothing reported yet: every namespace is pending, with the time it became so
    before = status(admin, east)
    assert {n: s["currentState"] for n, s in before.items()} == {
        "shop": "PENDING",
        "legacy": "PENDING",
        "ghost": "PENDING",
    }
    assert all(s["lastTransitionTime"] for s in before.values())
    assert before["shop"]["desiredState"] == ON and before["legacy"]["desiredState"] == OFF
    whole = ok(admin.get(f"{base}/status"))
    assert whole["fqn"] == created["fqn"] and "lastSyncTime" not in whole
    assert whole["workspace"] == f"organizations/{org}/tenants/onboarding/workspaces/onboarding"

    with agent(server, east) as east_agent:
        ok(report(east_agent, east, namespace("shop"), namespace("legacy"), namespace("other")))
        seen = status(admin, east)
        assert {n: s["currentState"] for n, s in seen.items()} == {
            "shop": "ONBOARDED",
            "legacy": "OFFBOARDED",
            "ghost": "NOT_FOUND_IN_CLUSTER",
        }
        assert seen["shop"]["lastTransitionTime"] > before["shop"]["lastTransitionTime"]
        assert ok(admin.get(f"{base}/status"))["stale"] is False

        # a report with the same view moves no transition time
        ok(report(east_agent, east, namespace("shop"), namespace("legacy")))
        assert status(admin, east) == seen

        # offboarding shop: pending until the agent reports again
        current = ok(admin.get(f"{base}/cfg"))
        ok(admin.put(f"{base}/cfg", json={**current, **config(shop=OFF, legacy=OFF, ghost=ON)}))
        after = status(admin, east)
        assert after["shop"]["currentState"] == "PENDING"
        assert after["legacy"] == seen["legacy"]  # unchanged desire keeps its state and time
        assert selector(admin, org) == [f"{east['fqn'].rsplit('/', 1)[1]}/ghost"]
        ok(report(east_agent, east, namespace("shop"), namespace("legacy")))
        assert status(admin, east)["shop"]["currentState"] == "OFFBOARDED"


def test_onboarded_namespaces_join_the_onboarding_workspace(
    server: MgmtServer, admin: httpx.Client, org: str
) -> None:
    east = create_cluster(admin, org, "east")
    west = create_cluster(admin, org, "west")
    err(admin.get(f"/v2/organizations/{org}/tenants/onboarding"), 404)
    ok(
        admin.post(
            f"/v2/{east['fqn']}/onboarding", json={"name": "c", "config": config(b=ON, a=ON, x=OFF)}
        )
    )
    tenant = ok(admin.get(f"/v2/organizations/{org}/tenants/onboarding"))
    assert tenant["fqn"] == f"organizations/{org}/tenants/onboarding"
    assert selector(admin, org) == ["east/a", "east/b"]

    # entries of other clusters, and ones an admin added, are kept
    path = f"/v2/organizations/{org}/tenants/onboarding/workspaces/onboarding"
    ws = ok(admin.get(path))
    ws["namespaceSelector"]["names"].insert(0, "*/shared")
    ok(admin.put(path, json=ws))
    ok(admin.post(f"/v2/{west['fqn']}/onboarding", json={"name": "c", "config": config(w=ON)}))
    assert selector(admin, org) == ["*/shared", "east/a", "east/b", "west/w"]

    ok(admin.delete(f"/v2/{west['fqn']}/onboarding/c"))
    assert selector(admin, org) == ["*/shared", "east/a", "east/b"]
    ok(admin.delete(f"/v2/{east['fqn']}"))  # the cluster takes its config along
    assert selector(admin, org) == ["*/shared"]

    # the sync is audited like any write
    logs = ok(admin.get(f"/v2/organizations/{org}/auditlogs", params={"pageSize": 100}))
    updates = [a for a in logs["auditLogs"] if a["fqn"] == path[4:] and a["operation"] == "UPDATE"]
    assert any("namespaceSelector" in a["message"] for a in updates)


def test_one_config_per_cluster(server: MgmtServer, admin: httpx.Client, org: str) -> None:
    east = create_cluster(admin, org, "east")
    base = f"/v2/{east['fqn']}/onboarding"
    ok(admin.post(base, json={"name": "first", "config": config(shop=ON)}))
    body = err(
        admin.post(base, json={"name": "second", "config": config(cart=ON)}), 409, "ALREADY_EXISTS"
    )
    assert f"{base[4:]}/first" in body["message"]
    assert [c["fqn"] for c in ok(admin.get(base))["configs"]] == [f"{base[4:]}/first"]
    assert selector(admin, org) == ["east/shop"]  # the refused config changed nothing


def test_system_namespaces_are_refused_by_name(server: MgmtServer, admin: httpx.Client) -> None:
    org = unique("org")
    ok(
        admin.post(
            "/v2/organizations",
            json={
                "name": org,
                "organization": {"systemNamespaces": ["kube-system", "istio-system"]},
            },
        )
    )
    east = create_cluster(admin, org, "east")
    base = f"/v2/{east['fqn']}/onboarding"
    body = err(
        admin.post(
            base,
            json={
                "name": "c",
                "config": config(shop=ON, **{"kube-system": OFF, "istio-system": ON}),
            },
        ),
        400,
        "INVALID_ARGUMENT",
    )
    assert "kube-system" in body["message"] and "istio-system" in body["message"]
    assert "shop" not in body["message"]
    ok(admin.post(base, json={"name": "c", "config": config(shop=ON)}))
    current = ok(admin.get(f"{base}/c"))
    body = err(admin.put(f"{base}/c", json={**current, **config(**{"kube-system": ON})}), 400)
    assert "kube-system" in body["message"]


@pytest.mark.parametrize(
    ("name", "body", "field"),
    [
        (
            "c",
            {"namespaces": [{"name": "shop", "desiredState": "ONBOARDED"}]},
            "config.namespaces[0].desiredState",
        ),
        ("c", config(Shop=ON), "config.namespaces[0].name"),
        (
            "c",
            {"namespaces": [{"name": "a", "desiredState": ON}, {"name": "a", "desiredState": OFF}]},
            "config.namespaces[1].name",
        ),
        ("c", {}, "config.namespaces"),
        ("status", config(a=ON), "name"),
    ],
)
def test_invalid_configs_name_the_field(
    server: MgmtServer, admin: httpx.Client, org: str, name: str, body: dict, field: str
) -> None:
    east = create_cluster(admin, org, "east")
    got = err(admin.post(f"/v2/{east['fqn']}/onboarding", json={"name": name, "config": body}), 400)
    assert got["details"][1]["fieldViolations"][0]["field"] == field, got


def test_status_needs_read(
    server: MgmtServer, admin: httpx.Client, org: str, make_user: Callable[..., httpx.Client]
) -> None:
    east = create_cluster(admin, org, "east")
    create_cluster(admin, org, "west")
    path = f"/v2/{east['fqn']}/onboarding/status"
    with server.client() as anonymous:
        err(anonymous.get(path), 401, "UNAUTHENTICATED")
    name = unique("u")
    with make_user(org, name) as user:
        err(user.get(path), 403, "PERMISSION_DENIED")
        grant(
            admin,
            f"organizations/{org}/clusters/west",
            "rbac/reader",
            {"user": f"organizations/{org}/users/{name}"},
        )
        err(user.get(path), 403)  # a grant on another cluster does not help
        grant(admin, east["fqn"], "rbac/reader", {"user": f"organizations/{org}/users/{name}"})
        assert ok(user.get(path))["namespaces"] == []
    err(admin.get(f"/v2/organizations/{org}/clusters/nope/onboarding/status"), 404)


@pytest.fixture(scope="module")
def renamed() -> Iterator[MgmtServer]:
    with tuned_server(
        MESHPLANE_ONBOARDING_TENANT="mesh-onboarding", MESHPLANE_ONBOARDING_WORKSPACE="auto"
    ) as srv:
        yield srv


def test_onboarding_names_are_configurable(renamed: MgmtServer) -> None:
    with renamed.admin() as admin:
        org = unique("org")
        ok(admin.post("/v2/organizations", json={"name": org, "organization": {}}))
        east = create_cluster(admin, org, "east")
        ok(
            admin.post(
                f"/v2/{east['fqn']}/onboarding", json={"name": "c", "config": config(shop=ON)}
            )
        )
        ws = ok(admin.get(f"/v2/organizations/{org}/tenants/mesh-onboarding/workspaces/auto"))
        assert ws["namespaceSelector"]["names"] == ["east/shop"]
        err(admin.get(f"/v2/organizations/{org}/tenants/onboarding"), 404)
