"""Cluster onboarding: configs, the onboarding workspace, status from reports."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from meshplane.config_error import ConfigError
from mgmt_api.domain import onboarding as ob
from mgmt_api.kinds import KindSettings
from tests.mgmt_api.agents import agent, create_cluster, namespace, report, tuned_server
from tests.mgmt_api.harness import MgmtServer, err, ok, unique
from tests.mgmt_api.rbac_helpers import grant

ON, OFF = "DESIRED_ONBOARDED", "DESIRED_OFFBOARDED"


def config(**states: str) -> dict[str, Any]:
    return {"namespaces": [{"name": n, "desiredState": s} for n, s in states.items()]}


def status(client: httpx.Client, cluster: dict[str, Any]) -> dict[str, dict[str, Any]]:
    body = ok(client.get(f"/v2/{cluster['fqn']}/onboarding/status"))
    return {ns["name"]: ns for ns in body["namespaces"]}


def selector(admin: httpx.Client, org: str) -> list[str]:
    ws = ok(admin.get(f"/v2/organizations/{org}/tenants/onboarding/workspaces/onboarding"))
    names: list[str] = ws["namespaceSelector"]["names"]
    return names


@pytest.mark.parametrize(
    ("desired", "reported", "state"),
    [
        (ON, {"a": True}, "ONBOARDED"),
        (ON, {"a": False}, "FAILED"),  # the agent lists it, but did not onboard it
        (OFF, {"a": False}, "OFFBOARDED"),
        (OFF, {"a": True}, "FAILED"),  # still onboarded
        (ON, {"other": True}, "NOT_FOUND_IN_CLUSTER"),
        (OFF, {}, "NOT_FOUND_IN_CLUSTER"),
    ],
)
def test_current_state_comes_from_the_report_not_the_desire(
    desired: str, reported: dict[str, bool], state: str
) -> None:
    pending = ob.statuses(config(a=desired), {}, None, now_us=10)
    assert pending["a"]["currentState"] == "PENDING"
    # a report sent before the desire was set says nothing about it
    assert ob.statuses(config(a=desired), pending, ob.Report(reported, 5), 11) == pending
    seen = ob.statuses(config(a=desired), pending, ob.Report(reported, 20), now_us=20)["a"]
    assert (seen["currentState"], seen["lastTransitionTime"]) == (state, 20)
    assert ("message" in seen) is (state not in ("ONBOARDED", "OFFBOARDED"))


def test_transition_times_move_only_with_the_state() -> None:
    spec = config(a=ON, b=OFF)
    first = ob.statuses(spec, {}, ob.Report({"a": False, "b": False}, 20), now_us=20)
    assert first["a"]["currentState"] == "FAILED"
    fixed = ob.statuses(spec, first, ob.Report({"a": True, "b": False}, 30), now_us=30)
    assert fixed["a"]["currentState"] == "ONBOARDED" and fixed["a"]["lastTransitionTime"] == 30
    assert fixed["b"] == first["b"]  # same state: same time
    flipped = ob.statuses(config(a=OFF, b=OFF), fixed, ob.Report({"a": True}, 30), 40)
    assert flipped["a"]["currentState"] == "PENDING" and flipped["a"]["desiredSince"] == 40


@pytest.mark.parametrize(
    ("reported", "onboarded"),
    [
        ({"name": "a"}, False),
        ({"name": "a", "onboarded": True}, True),
        ({"name": "a", "onboarded": False, "istio": {"istioInjection": "enabled"}}, False),
        ({"name": "a", "istio": {"istioInjection": "enabled"}}, True),
        ({"name": "a", "istio": {"istioInjection": "disabled", "istioRevision": "r1"}}, False),
        ({"name": "a", "istio": {"istioRevision": "canary"}}, True),
        ({"name": "a", "labels": {"istio-injection": "enabled"}}, True),
        ({"name": "a", "labels": {"istio.io/rev": "r1"}}, True),
        ({"name": "a", "labels": {"istio-injection": "disabled", "istio.io/rev": "r1"}}, False),
    ],
)
def test_what_counts_as_onboarded_in_a_report(reported: dict[str, Any], onboarded: bool) -> None:
    assert ob.reported_onboarded(reported) is onboarded


@pytest.mark.parametrize(
    ("names", "owned", "onboard", "after", "owned_after"),
    [
        # the sync adds its entries after the others, sorted
        (
            ["*/x", "west/w"],
            [],
            ["b", "a"],
            ["*/x", "west/w", "east/a", "east/b"],
            ["east/a", "east/b"],
        ),
        # an admin's entry for this cluster survives offboarding everything
        (["east/legacy", "east/a"], ["east/a"], [], ["east/legacy"], []),
        # an admin's entry the sync also wants stays the admin's
        (["east/legacy"], [], ["legacy"], ["east/legacy"], []),
        (["east/legacy"], [], [], ["east/legacy"], []),
        # nothing left: the placeholder keeps the workspace valid, and goes again
        (["east/a"], ["east/a"], [], [ob.NOTHING], []),
        ([ob.NOTHING], [], ["a"], ["east/a"], ["east/a"]),
        # an owned entry an admin removed comes back while still wanted
        ([], ["east/a"], ["a"], ["east/a"], ["east/a"]),
    ],
)
def test_selector_sync_removes_only_its_own_entries(
    names: list[str], owned: list[str], onboard: list[str], after: list[str], owned_after: list[str]
) -> None:
    assert ob.sync_selector(names, "east", onboard, owned) == (after, owned_after)


def test_states_follow_the_agent_reports(server: MgmtServer, admin: httpx.Client, org: str) -> None:
    east = create_cluster(admin, org, "east")
    base = f"/v2/{east['fqn']}/onboarding"
    created = ok(
        admin.post(
            base, json={"name": "cfg", "config": config(shop=ON, legacy=OFF, ghost=ON, cart=ON)}
        )
    )
    assert created["fqn"] == f"{east['fqn']}/onboarding/cfg"

    # nothing reported yet: every namespace is pending, with the time it became so
    before = status(admin, east)
    assert {n: s["currentState"] for n, s in before.items()} == dict.fromkeys(
        ("shop", "legacy", "ghost", "cart"), "PENDING"
    )
    assert all(s["lastTransitionTime"] for s in before.values())
    assert before["shop"]["desiredState"] == ON and before["legacy"]["desiredState"] == OFF
    whole = ok(admin.get(f"{base}/status"))
    assert whole["fqn"] == created["fqn"] and "lastSyncTime" not in whole
    assert whole["workspace"] == f"organizations/{org}/tenants/onboarding/workspaces/onboarding"

    with agent(server, east) as east_agent:
        reported = (
            namespace("shop", onboarded=True),
            namespace("legacy", onboarded=False),
            namespace("cart", onboarded=False),  # listed, but the agent did not onboard it
            namespace("other"),
        )
        ok(report(east_agent, east, *reported))
        seen = status(admin, east)
        assert {n: s["currentState"] for n, s in seen.items()} == {
            "shop": "ONBOARDED",
            "legacy": "OFFBOARDED",
            "ghost": "NOT_FOUND_IN_CLUSTER",
            "cart": "FAILED",
        }
        assert "not onboarded" in seen["cart"]["message"]
        assert "message" not in seen["shop"]
        assert seen["shop"]["lastTransitionTime"] > before["shop"]["lastTransitionTime"]
        assert ok(admin.get(f"{base}/status"))["stale"] is False

        # a report with the same view moves no transition time
        ok(report(east_agent, east, *reported[:3]))
        assert status(admin, east) == seen

        # the agent catches up with cart: FAILED becomes ONBOARDED
        ok(report(east_agent, east, *reported[:2], namespace("cart", onboarded=True)))
        assert status(admin, east)["cart"]["currentState"] == "ONBOARDED"

        # offboarding shop: pending until the agent reports again
        current = ok(admin.get(f"{base}/cfg"))
        ok(admin.put(f"{base}/cfg", json={**current, **config(shop=OFF, legacy=OFF, ghost=ON)}))
        after = status(admin, east)
        assert after["shop"]["currentState"] == "PENDING"
        assert after["legacy"] == seen["legacy"]  # unchanged desire keeps its state and time
        assert selector(admin, org) == ["east/ghost"]
        # still injected: the agent did not offboard it
        ok(report(east_agent, east, namespace("shop", onboarded=True), reported[1]))
        assert status(admin, east)["shop"]["currentState"] == "FAILED"
        ok(report(east_agent, east, namespace("shop", onboarded=False), reported[1]))
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

    # entries of other clusters, and ones an admin added (even for this cluster), are kept
    path = f"/v2/organizations/{org}/tenants/onboarding/workspaces/onboarding"
    ws = ok(admin.get(path))
    ws["namespaceSelector"]["names"][:0] = ["*/shared", "east/legacy"]
    ok(admin.put(path, json=ws))
    ok(admin.post(f"/v2/{west['fqn']}/onboarding", json={"name": "c", "config": config(w=ON)}))
    assert selector(admin, org) == ["*/shared", "east/legacy", "east/a", "east/b", "west/w"]

    ok(admin.delete(f"/v2/{west['fqn']}/onboarding/c"))
    assert selector(admin, org) == ["*/shared", "east/legacy", "east/a", "east/b"]
    cfg = ok(admin.get(f"/v2/{east['fqn']}/onboarding/c"))
    ok(admin.put(f"/v2/{east['fqn']}/onboarding/c", json={**cfg, **config(a=ON, x=OFF)}))
    assert selector(admin, org) == ["*/shared", "east/legacy", "east/a"]
    ok(admin.delete(f"/v2/{east['fqn']}"))  # the cluster takes its config along
    assert selector(admin, org) == ["*/shared", "east/legacy"]

    # the sync is audited like any write
    logs = ok(admin.get(f"/v2/organizations/{org}/auditlogs", params={"pageSize": 100}))
    updates = [a for a in logs["auditLogs"] if a["fqn"] == path[4:] and a["operation"] == "UPDATE"]
    assert any("namespaceSelector" in a["message"] for a in updates)


def test_offboarding_everything_leaves_a_valid_workspace(
    server: MgmtServer, admin: httpx.Client, org: str
) -> None:
    east = create_cluster(admin, org, "east")
    base = f"/v2/{east['fqn']}/onboarding"
    ok(admin.post(base, json={"name": "c", "config": config(a=ON)}))
    cfg = ok(admin.get(f"{base}/c"))
    ok(admin.put(f"{base}/c", json={**cfg, **config(a=OFF)}))
    # it selects nothing, and a client can still write back what it read
    assert selector(admin, org) == [ob.NOTHING]
    path = f"/v2/organizations/{org}/tenants/onboarding/workspaces/onboarding"
    ws = ok(admin.get(path))
    ok(admin.put(path, json={**ws, "description": "kept by hand"}))
    # onboarding again replaces it
    cfg = ok(admin.get(f"{base}/c"))
    ok(admin.put(f"{base}/c", json={**cfg, **config(a=ON, b=ON)}))
    assert selector(admin, org) == ["east/a", "east/b"]


def test_reports_and_config_writes_race_without_deadlock_or_lost_status(
    server: MgmtServer, admin: httpx.Client, org: str
) -> None:
    """Reports no longer serialise on the revision row: they lock the cluster row,
    and skip a config row that a config write holds. Racing both must neither
    fail (a deadlock would surface as a 500) nor leave a stale status."""
    east = create_cluster(admin, org, "east")
    base = f"/v2/{east['fqn']}/onboarding"
    ok(admin.post(base, json={"name": "c", "config": config(a=ON, b=ON)}))
    failures: list[str] = []

    def agent_loop() -> None:
        with agent(server, east) as a:
            for i in range(15):
                body = (namespace("a", onboarded=i % 2 == 0), namespace("b", onboarded=True))
                r = report(a, east, *body)
                if r.status_code != 200:
                    failures.append(r.text)

    def admin_loop() -> None:
        with server.admin() as client:
            for i in range(15):
                cfg = ok(client.get(f"{base}/c"))
                states = config(a=ON, b=ON if i % 2 else OFF)
                r = client.put(f"{base}/c", json={**cfg, **states})
                if r.status_code != 200:
                    failures.append(r.text)

    threads = [threading.Thread(target=agent_loop), threading.Thread(target=admin_loop)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    # whatever the interleaving, the next write and report settle the status
    cfg = ok(admin.get(f"{base}/c"))
    ok(admin.put(f"{base}/c", json={**cfg, **config(a=ON, b=OFF)}))
    with agent(server, east) as a:
        ok(report(a, east, namespace("a", onboarded=True), namespace("b", onboarded=True)))
    assert {n: s["currentState"] for n, s in status(admin, east).items()} == {
        "a": "ONBOARDED",
        "b": "FAILED",
    }


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
    server: MgmtServer, admin: httpx.Client, org: str, name: str, body: dict[str, Any], field: str
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


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("MESHPLANE_ONBOARDING_TENANT", "Onboarding"),
        ("MESHPLANE_ONBOARDING_WORKSPACE", "auto/x"),
        ("MESHPLANE_ONBOARDING_WORKSPACE", "a" * 64),
    ],
)
def test_bad_onboarding_names_stop_the_start_with_a_clear_error(
    tmp_path: Path, setting: str, value: str
) -> None:
    env = {**os.environ, "MESHPLANE_DATA_DIR": str(tmp_path), setting: value}
    env.pop("MESHPLANE_DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "mgmt_api.cli", "serve", "--listen", "127.0.0.1:0"],
        env={**env, "MESHPLANE_GRPC_LISTEN": "off", "MESHPLANE_ADMIN_PASSWORD": "x" * 12},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    stderr = " ".join(done.stderr.split())  # the traceback printer wraps long lines
    assert f"{setting}: {value!r} is not a DNS-1123 label" in stderr, stderr[-2000:]
    field: dict[str, Any] = {"onboarding_" + setting.rsplit("_", 1)[1].lower(): value}
    with pytest.raises(ConfigError):
        KindSettings(**field)
    KindSettings("mesh-onboarding", "auto")  # valid names pass
