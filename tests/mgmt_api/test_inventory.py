"""Agent inventory reports: who may send them, what the cluster shows, bad reports, staleness."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.mgmt_api.agents import (
    agent,
    create_cluster,
    inventory_path,
    namespace,
    report,
    revision,
    tuned_server,
)
from tests.mgmt_api.harness import MgmtServer, err, ok, unique


def test_report_becomes_the_clusters_read_only_view(
    server: MgmtServer, admin: httpx.Client, org: str
) -> None:
    east = create_cluster(admin, org, "east")
    path = f"/v2/{east['fqn']}"
    with agent(server, east) as east_agent:
        state = ok(report(east_agent, east, namespace("shop", "cart", "web", workloads=True)))
    assert state["provider"] == "kind" and state["stale"] is False and state["lastSyncTime"]

    plain = ok(admin.get(path))
    assert plain["etag"] == east["etag"]  # agent data does not move the user's etag
    assert plain["state"] == {**state}
    assert [s["name"] for s in plain["namespaces"][0]["services"]] == ["cart", "web"]
    assert all("workloads" not in s for s in plain["namespaces"][0]["services"])
    full = ok(admin.get(path, params={"fetchWorkloads": "true"}))
    assert full["namespaces"][0]["services"][0]["workloads"] == [
        {"name": "cart-0", "address": "10.0.0.1"}
    ]
    listed = ok(admin.get(f"/v2/organizations/{org}/clusters", params={"fetchWorkloads": "true"}))
    assert "workloads" in listed["clusters"][0]["namespaces"][0]["services"][0]

    # users cannot write the read-only fields
    ok(admin.put(path, json={**plain, "namespaces": [], "state": {"provider": "x"}}))
    assert ok(admin.get(path))["namespaces"] == plain["namespaces"]


def test_changed_reports_are_audited_heartbeats_are_not(
    server: MgmtServer, admin: httpx.Client, org: str
) -> None:
    east = create_cluster(admin, org, "east")
    with agent(server, east) as east_agent:
        first = ok(report(east_agent, east, namespace("shop")))
        second = ok(report(east_agent, east, namespace("shop")))
        ok(report(east_agent, east, namespace("shop"), namespace("cart")))
    assert second["lastSyncTime"] > first["lastSyncTime"]
    logs = ok(admin.get(f"/v2/organizations/{org}/auditlogs", params={"pageSize": 100}))
    reports = [a for a in logs["auditLogs"] if a["operation"] == "REPORT_INVENTORY"]
    assert [a["properties"]["namespaces"] for a in reports] == [2, 1]  # newest first
    assert all(a["triggeredBy"] == f"{east['fqn']}/serviceaccounts/agent" for a in reports)


def test_reports_do_not_bump_the_revision_the_distribution_follows(
    server: MgmtServer, admin: httpx.Client, org: str
) -> None:
    """Every revision bump makes the policy distribution recompile every cluster's
    snapshot, and no snapshot reads reported data: neither heartbeats nor changed
    reports bump it, while a changed report still does all it must."""
    east = create_cluster(admin, org, "east")
    ok(
        admin.post(
            f"/v2/{east['fqn']}/onboarding",
            json={
                "name": "c",
                "config": {"namespaces": [{"name": "shop", "desiredState": "DESIRED_ONBOARDED"}]},
            },
        )
    )
    before = revision(admin, east)
    with agent(server, east) as east_agent:
        first = ok(report(east_agent, east, namespace("shop", onboarded=True)))
        assert revision(admin, east) == before
        beat = ok(report(east_agent, east, namespace("shop", onboarded=True)))  # heartbeat
        assert revision(admin, east) == before
        assert beat["lastSyncTime"] > first["lastSyncTime"]
        ok(report(east_agent, east, namespace("shop", onboarded=False), namespace("cart")))
        assert revision(admin, east) == before
    # ... and the changed report was stored, audited and reached the onboarding status
    cluster = ok(admin.get(f"/v2/{east['fqn']}"))
    assert [ns["name"] for ns in cluster["namespaces"]] == ["shop", "cart"]
    assert cluster["etag"] == east["etag"]
    logs = ok(admin.get(f"/v2/organizations/{org}/auditlogs", params={"pageSize": 100}))
    assert [
        a["properties"]["namespaces"]
        for a in logs["auditLogs"]
        if a["operation"] == "REPORT_INVENTORY"
    ] == [2, 1]
    onboarding = ok(admin.get(f"/v2/{east['fqn']}/onboarding/status"))
    assert onboarding["namespaces"][0]["currentState"] == "FAILED"
    # a user's write still bumps it: the revision is observable here
    ok(admin.put(f"/v2/{east['fqn']}", json={**cluster, "description": "x"}))
    assert revision(admin, east) > before


def test_concurrent_reports_of_one_cluster_are_serialised(
    server: MgmtServer, admin: httpx.Client, org: str
) -> None:
    """Agent replicas reporting at once: each report is compared with the one
    committed just before it (the cluster's row lock), so a content change is
    audited once, and never twice in a row for the same content."""
    east = create_cluster(admin, org, "east")
    contents = [[namespace(f"ns-{k}") for k in range(j + 1)] for j in range(3)]
    errors: list[str] = []

    def send(offset: int) -> None:
        with agent(server, east) as east_agent:
            for i in range(8):
                got = report(east_agent, east, *contents[(i + offset) % 3])
                if got.status_code != 200:
                    errors.append(got.text)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    logs = ok(admin.get(f"/v2/organizations/{org}/auditlogs", params={"pageSize": 1000}))
    audited = [
        a["properties"]["namespaces"]
        for a in reversed(logs["auditLogs"])
        if a["operation"] == "REPORT_INVENTORY"
    ]
    assert audited and all(a != b for a, b in itertools.pairwise(audited)), audited
    stored = ok(admin.get(f"/v2/{east['fqn']}"))["namespaces"]
    assert len(stored) == audited[-1]  # the last audited content is the stored one


def test_only_the_clusters_own_agent_may_report(
    server: MgmtServer, admin: httpx.Client, org: str
) -> None:
    east = create_cluster(admin, org, "east")
    west = create_cluster(admin, org, "west")
    body: dict[str, Any] = {"namespaces": [], "state": {}}
    with server.client() as anonymous:
        err(anonymous.put(inventory_path(east), json=body), 401, "UNAUTHENTICATED")
    with server.client(headers={"Authorization": "Bearer not-a-jwt"}) as forged:
        err(forged.put(inventory_path(east), json=body), 401)
    err(admin.put(inventory_path(east), json=body), 403, "PERMISSION_DENIED")  # even the admin
    with agent(server, west) as west_agent:
        denied = err(report(west_agent, east, namespace("evil")), 403, "PERMISSION_DENIED")
        assert f"{east['fqn']}/serviceaccounts/agent" in denied["message"]
        ok(report(west_agent, west, namespace("shop")))
    assert ok(admin.get(f"/v2/{east['fqn']}"))["namespaces"] == []

    # the agent holds no role: its report is admitted by the cluster-accounts table,
    # and another account of the same cluster (extauthz's) is refused
    policy = ok(admin.get(f"/v2/{east['fqn']}/policy"))
    assert "serviceaccounts/" not in json.dumps(policy)
    with agent(server, east) as east_agent:
        ok(report(east_agent, east, namespace("shop")))
        err(east_agent.get(f"/v2/{east['fqn']}"), 403, "PERMISSION_DENIED")
    with agent(server, east, "extauthz") as extauthz:
        denied = err(report(extauthz, east, namespace("evil")), 403, "PERMISSION_DENIED")
        assert "serviceaccounts/extauthz" in denied["message"]

    # deleting the cluster revokes the key
    west_agent = agent(server, west)
    ok(admin.delete(f"/v2/{west['fqn']}"))
    err(report(west_agent, west, namespace("shop")), 401)
    west_agent.close()


def _too_many(n: int) -> dict[str, Any]:
    return {"namespaces": [{"name": f"ns-{i}"} for i in range(n)], "state": {}}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"namespaces": [{"name": "shop"}]}, "state"),
        ({"namespaces": [{"name": "Shop"}], "state": {}}, "namespaces[0].name"),
        ({"namespaces": [{"name": "a"}, {"name": "a"}], "state": {}}, "namespaces[1].name"),
        (
            {
                "namespaces": [
                    {"name": "a", "services": [{"name": "s", "ports": [{"number": 0}]}]}
                ],
                "state": {},
            },
            "namespaces[0].services[0].ports[0].number",
        ),
        ({"namespaces": [{"name": "a", "widgets": []}], "state": {}}, "namespaces[0].widgets"),
        (
            {"namespaces": [{"name": "a", "pods": [{"name": "p"}]}], "state": {}},
            "namespaces[0].pods[0].uid",
        ),
        (
            {"namespaces": [{"name": "a", "pods": [{"name": "p", "uid": "u"}] * 2}], "state": {}},
            "namespaces[0].pods[1].name",
        ),
        (
            {
                "namespaces": [
                    {"name": "a", "pods": [{"name": "p", "uid": "u", "services": ["s"] * 33}]}
                ],
                "state": {},
            },
            "namespaces[0].pods[0].services",
        ),
        (
            {
                "namespaces": [],
                "state": {
                    "serviceAccountIssuer": {
                        "issuer": "https://i",
                        "jwks": {"keys": [{"kty": "oct", "k": "c2VjcmV0"}]},
                    }
                },
            },
            "state.serviceAccountIssuer.jwks",
        ),
        (
            {"namespaces": [], "state": {"serviceAccountIssuer": {"jwks": {"keys": []}}}},
            "state.serviceAccountIssuer.issuer",
        ),
        (_too_many(2001), "namespaces"),
        (
            {
                "namespaces": [{"name": "a", "services": [{"name": f"s{i}"} for i in range(1001)]}],
                "state": {},
            },
            "namespaces[0].services",
        ),
    ],
)
def test_bad_reports_are_refused_and_the_last_good_one_kept(
    server: MgmtServer, admin: httpx.Client, org: str, body: dict[str, Any], field: str
) -> None:
    east = create_cluster(admin, org, "east")
    with agent(server, east) as east_agent:
        good = ok(report(east_agent, east, namespace("shop", "cart")))
        got = err(east_agent.put(inventory_path(east), json=body), 400, "INVALID_ARGUMENT")
        assert got["details"][1]["fieldViolations"][0]["field"] == field, got
        assert "c2VjcmV0" not in json.dumps(got)  # a refused key is not echoed
    cluster = ok(admin.get(f"/v2/{east['fqn']}"))
    assert cluster["namespaces"] == [namespace("shop", "cart")]
    assert cluster["state"]["lastSyncTime"] == good["lastSyncTime"]


def test_malformed_or_oversized_bodies_are_refused(
    server: MgmtServer, admin: httpx.Client, org: str
) -> None:
    east = create_cluster(admin, org, "east")
    with agent(server, east) as east_agent:
        ok(report(east_agent, east, namespace("shop")))
        headers = {"Content-Type": "application/json"}
        err(east_agent.put(inventory_path(east), content=b'{"namespaces": [', headers=headers), 400)
        huge = {"namespaces": [{"name": "a", "labels": {"k": "v" * 2_000_000}}], "state": {}}
        body = err(east_agent.put(inventory_path(east), json=huge), 400)
        assert "larger than" in body["message"]
    assert ok(admin.get(f"/v2/{east['fqn']}"))["namespaces"] == [namespace("shop")]


@pytest.fixture(scope="module")
def impatient() -> Iterator[MgmtServer]:
    """Agents count as stale after 50 ms of silence."""
    with tuned_server(MESHPLANE_AGENT_STALE_AFTER="50ms") as srv:
        yield srv


def test_silent_agents_make_their_cluster_stale(impatient: MgmtServer) -> None:
    with impatient.admin() as admin:
        org = unique("org")
        ok(admin.post("/v2/organizations", json={"name": org, "organization": {}}))
        east = create_cluster(admin, org, "east")
        assert "state" not in ok(admin.get(f"/v2/{east['fqn']}"))  # never reported
        with agent(impatient, east) as east_agent:
            first = ok(report(east_agent, east, namespace("shop")))
            deadline = time.monotonic() + 30
            while not (state := ok(admin.get(f"/v2/{east['fqn']}"))["state"])["stale"]:
                assert time.monotonic() < deadline, "never became stale"
                time.sleep(0.02)
            assert state["lastSyncTime"] == first["lastSyncTime"]
            status = ok(admin.get(f"/v2/{east['fqn']}/onboarding/status"))
            assert status["stale"] is True
            again = ok(report(east_agent, east, namespace("shop")))
            assert again["lastSyncTime"] > first["lastSyncTime"]
