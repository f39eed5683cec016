"""Who may open the tunnel, what closes it, and what a caller sees when parts are down.

A cluster's key serves that cluster only; a tunnel token is no REST or
policy-stream credential; revoking the key or deleting the cluster closes
an open tunnel; an agent that is down is a 503 naming the cluster (and the
agent reconnects when it is back); a hung proxy is a 504 and a dead one a
503, each naming the proxy, while the other instances still answer; and no
request, however crafted, reaches an admin endpoint outside the allow-list.
"""

from __future__ import annotations

import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import httpx

from agent.contract import TUNNEL_AUDIENCE
from meshplane.control_plane import load_credentials
from meshplane.proto.tunnel.v1 import tunnel_pb2 as pb
from meshplane.proto.tunnel.v1 import tunnel_pb2_grpc as pb_grpc
from tests.agent.fleet import ORG, Agent, Fleet, wait_ok
from tests.mgmt_api.harness import err, ok
from tests.support.net import free_port
from tests.support.processes import wait_until

WEB = {"namespace": "shop", "workload": "web"}


def _connect(fleet: Fleet, cluster: str, token: str) -> grpc.RpcError:
    """Open a tunnel by hand; return the error it is refused with."""
    hello = pb.AgentHello(organization=ORG, cluster=cluster, instance="probe")
    with grpc.insecure_channel(f"127.0.0.1:{fleet.mgmt.grpc_port}") as channel:
        stub = pb_grpc.AgentTunnelStub(channel)  # type: ignore[no-untyped-call]
        metadata = (("authorization", f"Bearer {token}"),)
        try:
            next(stub.Connect(iter([pb.AgentMessage(hello=hello)]), metadata=metadata, timeout=10))
        except grpc.RpcError as exc:
            return exc
    raise AssertionError("the tunnel was admitted")


def test_a_clusters_key_cannot_serve_another_cluster(fleet: Fleet) -> None:
    key_a = load_credentials(fleet.credentials("a"))
    refused = _connect(fleet, "b", key_a.token(audience=TUNNEL_AUDIENCE))
    assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
    details = refused.details()
    assert details is not None and "clusters/a" in details
    # a policy-stream token does not open the tunnel either
    refused = _connect(fleet, "a", key_a.token())
    assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
    # and a tunnel token is no REST credential
    rest = httpx.get(
        fleet.mgmt.url + f"/v2/organizations/{ORG}/clusters/a",
        headers={"authorization": f"Bearer {key_a.token(audience=TUNNEL_AUDIENCE)}"},
    )
    err(rest, 401, "UNAUTHENTICATED")
    # A real agent started for b with a's key never connects; b stays unserved.
    agent = Agent(fleet.tmp, fleet.mgmt, "b", fleet.credentials("a"), fleet.proxies_file)
    # The agent's own start-up check refuses a key whose template names another cluster.
    agent.service.args[agent.service.args.index(str(fleet.credentials("a")))] = str(
        _bare_key(fleet, "a")
    )
    try:
        agent.start()
        wait_until(
            lambda: "PERMISSION_DENIED" in agent.log.read_text(), what="the refusal in the log"
        )
        assert not agent.ready()
        err(fleet.admin.post(fleet.path("serverstats", "b"), json=WEB), 503, "UNAVAILABLE")
    finally:
        agent.stop()


def _bare_key(fleet: Fleet, cluster: str) -> Any:
    """Only the JWK (no clusterFqn), so the agent cannot tell it is another cluster's."""
    path = fleet.tmp / f"bare-{cluster}.json"
    path.write_text(fleet.secrets[cluster]["jwk"])
    return path


def test_revoking_the_key_or_deleting_the_cluster_closes_the_tunnel(fleet: Fleet) -> None:
    secret = fleet.create_cluster("revoke")
    agent = fleet.start_agent("revoke")
    wait_ok(fleet.admin, "POST", fleet.path("serverstats", "revoke"), WEB)
    sa = f"/v2/organizations/{ORG}/clusters/revoke/serviceaccounts/agent"
    ok(fleet.admin.delete(f"{sa}/keys/{secret['keyId']}"))
    wait_until(lambda: not agent.ready(), timeout=30, what="the revoked tunnel to close")
    response = fleet.admin.post(fleet.path("serverstats", "revoke"), json=WEB)
    assert "clusters/revoke" in err(response, 503, "UNAVAILABLE")["message"]
    assert "PERMISSION_DENIED" in agent.log.read_text()
    agent.stop()

    fleet.create_cluster("gone")
    agent = fleet.start_agent("gone")
    wait_ok(fleet.admin, "POST", fleet.path("serverstats", "gone"), WEB)
    ok(fleet.admin.delete(f"/v2/organizations/{ORG}/clusters/gone"))
    wait_until(lambda: not agent.ready(), timeout=30, what="the deleted cluster's tunnel to close")
    agent.stop()


def test_agent_down_is_503_and_it_reconnects(fleet: Fleet) -> None:
    fleet.create_cluster("flaky")
    agent = fleet.start_agent("flaky")
    wait_ok(fleet.admin, "POST", fleet.path("clusterstats", "flaky"), WEB)
    assert agent.stop() == 0  # drained on SIGTERM
    wait_until(
        lambda: fleet.admin.post(fleet.path("clusterstats", "flaky"), json=WEB).status_code == 503,
        what="mgmt-api to notice the agent left",
    )
    body = err(fleet.admin.post(fleet.path("clusterstats", "flaky"), json=WEB), 503, "UNAVAILABLE")
    assert "organizations/diag/clusters/flaky" in body["message"]
    agent.start()
    wait_ok(fleet.admin, "POST", fleet.path("clusterstats", "flaky"), WEB)
    agent.stop()


def test_mgmt_api_restart_the_agent_reconnects(fleet: Fleet) -> None:
    fleet.mgmt.stop()
    time.sleep(0)  # nothing to wait for: the agent retries with backoff (max 1 s here)
    fleet.mgmt.start()
    wait_ok(fleet.admin, "POST", fleet.path("clusterstats"), WEB, timeout=60)


def test_a_hung_proxy_is_504_and_a_dead_one_503_naming_it(fleet: Fleet) -> None:
    envoy = fleet.envoys["web-2"]
    envoy.proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
    try:
        # Both calls at once, so the proxy timeout is waited out once, not twice.
        with ThreadPoolExecutor(2) as pool:
            one, every = (
                pool.submit(fleet.admin.post, fleet.path("serverstats"), json=body)
                for body in ({**WEB, "instance": "web-2"}, {**WEB, "includeServerInfo": True})
            )
            response, answer = one.result(), ok(every.result())
        body = err(response, 504, "DEADLINE_EXCEEDED")
        assert "shop/web/web-2" in body["message"]
        # every instance: web-1 answers, web-2 carries its error
        by_instance = {i["instance"]: i for i in answer["instances"]}
        assert by_instance["web-1"]["serverInfo"]["state"] == "LIVE"
        assert by_instance["web-2"]["error"]["details"][0]["reason"] == "DEADLINE_EXCEEDED"
    finally:
        envoy.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
    entries = fleet.entries()
    dead = f"127.0.0.1:{free_port()}"
    fleet.write_proxies(
        [
            *entries,
            {"namespace": "shop", "workload": "dead", "instance": "dead-1", "adminAddress": dead},
        ]
    )
    try:
        response = wait_until(
            lambda: (
                (
                    r := fleet.admin.post(
                        fleet.path("clusterstats"), json={"namespace": "shop", "workload": "dead"}
                    )
                ).status_code
                != 404
                and r
            ),
            what="the agent to reload its proxies file",
        )
        body = err(response, 503, "UNAVAILABLE")
        assert "shop/dead/dead-1" in body["message"] and dead in body["message"]
    finally:
        fleet.write_proxies(entries)


def test_no_crafted_request_reaches_quitquitquit(fleet: Fleet) -> None:
    crafted: list[tuple[str, str, dict[str, Any]]] = [
        ("POST", "serverstats", {**WEB, "filter": "x&quitquitquit"}),
        ("POST", "serverstats", {**WEB, "filter": "/../quitquitquit?"}),
        ("POST", "serverstats", {**WEB, "filter": "a\r\nPOST /quitquitquit HTTP/1.1\r\n"}),
        ("POST", "configdump", {**WEB, "resource": "quitquitquit"}),
        ("POST", "configdump", {**WEB, "mask": "x/../../quitquitquit"}),
        ("PUT", "loggerlevels", {**WEB, "loggers": {"../quitquitquit": "info"}}),
        ("PUT", "loggerlevels", {**WEB, "loggers": {"admin": "info&quitquitquit"}}),
        ("PUT", "loggerlevels", {**WEB, "level": "info\nquitquitquit"}),
        ("POST", "clusterstats", {**WEB, "instance": "web-1/../../quitquitquit"}),
        ("POST", "clusterstats", {**WEB, "workload": "quitquitquit"}),
        ("POST", "clusterstats", {**WEB, "path": "/quitquitquit"}),
    ]
    for method, endpoint, body in crafted:
        response = fleet.admin.request(method, fleet.path(endpoint), json=body)
        assert response.status_code in (200, 400, 404), (body, response.text)
    for name, envoy in fleet.envoys.items():
        assert envoy.proc is not None and envoy.proc.poll() is None, name
        assert envoy.ready(), name
        stats = envoy.admin("GET", "/stats?filter=server.state&format=json").json()
        assert stats["stats"][0]["value"] == 0, name  # 0 = LIVE, never draining
    # ... and the proxies still answer through the tunnel
    assert len(ok(fleet.admin.post(fleet.path("clusterstats"), json=WEB))["instances"]) == 2


def test_a_huge_config_dump_is_a_clear_error(fleet: Fleet) -> None:
    fleet.create_cluster("small")
    agent = fleet.start_agent("small", "--max-response-bytes", "4096")
    try:
        response = fleet.admin.post(fleet.path("configdump", "small"), json=WEB)
        body = err(response, 429, "RESOURCE_EXHAUSTED")
        assert "4096" in body["message"] and "--max-response-bytes" in body["message"]
        # small answers still pass
        wait_ok(
            fleet.admin, "POST", fleet.path("loggerlevels", "small"), {**WEB, "instance": "web-1"}
        )
    finally:
        agent.stop()


def test_the_tunnel_reports_the_inventory(fleet: Fleet) -> None:
    def reported() -> Any:
        cluster = ok(fleet.admin.get(f"/v2/organizations/{ORG}/clusters/a?fetchWorkloads=true"))
        return cluster if cluster.get("state", {}).get("provider") == "static" else None

    cluster = wait_until(reported, timeout=30, what="the agent's inventory")
    [shop] = cluster["namespaces"]
    assert shop["name"] == "shop" and shop["onboarded"] is True
    services = {s["name"]: [w["name"] for w in s["workloads"]] for s in shop["services"]}
    assert services == {"api": ["api-1"], "web": ["web-1", "web-2"]}
    assert cluster["state"]["stale"] is False
    logs = ok(fleet.admin.get(f"/v2/organizations/{ORG}/auditlogs"))["auditLogs"]
    report = [e for e in logs if e["operation"] == "REPORT_INVENTORY"]
    assert report and report[-1]["triggeredBy"].endswith("clusters/a/serviceaccounts/agent")
    assert json.dumps(report[-1]).count("namespaces") >= 1
