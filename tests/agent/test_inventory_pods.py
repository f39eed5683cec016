"""The inventory's pods: service membership by selector (pure), the static file's ``pods:``,
and a static agent's report reaching mgmt-api, where its pods' tokens then verify."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.discovery.static import load, load_file
from agent.inventory import PodInfo, ServiceInfo, build_report, member_of
from meshplane.config_error import ConfigError
from tests.agent.fleet import ORG, Agent, Fleet
from tests.mgmt_api.harness import ok
from tests.support.processes import wait_until
from tests.support.workload_tokens import PodRef, TestIssuer, sign

SERVICES = [
    ServiceInfo("shop", "web", {"app": "web"}),
    ServiceInfo("shop", "web-canary", {"app": "web", "track": "canary"}),
    ServiceInfo("shop", "headless", {}),  # no selector: selects nothing
    ServiceInfo("billing", "web", {"app": "web"}),  # another namespace
]


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"app": "web"}, ["web"]),
        ({"app": "web", "track": "canary"}, ["web", "web-canary"]),
        ({"app": "db"}, []),
        ({}, []),
    ],
)
def test_membership_is_by_selector_in_the_pods_namespace(
    labels: dict[str, str], expected: list[str]
) -> None:
    assert member_of(PodInfo("shop", "p", "u", labels=labels), SERVICES) == expected


def test_the_report_lists_pods_under_their_namespace_with_the_issuer() -> None:
    pods = [
        PodInfo("shop", "web-1", "u1", "10.0.0.1", "web", {"app": "web"}),
        PodInfo("jobs", "batch-1", "u2"),  # a namespace only pods name
        PodInfo("shop", "vm-1", "u3", "127.0.0.1", "vm", services=("web", "web")),
    ]
    issuer = {"issuer": "https://i", "jwks": {"keys": []}}
    report = build_report(
        [], provider="kubernetes", agent_version="t", services=SERVICES, pods=pods, issuer=issuer
    )
    namespaces = {n["name"]: n for n in report["namespaces"]}
    assert namespaces["shop"]["pods"] == [
        {
            "name": "vm-1",
            "uid": "u3",
            "ip": "127.0.0.1",
            "serviceAccount": "vm",
            "services": ["web"],
        },
        {
            "name": "web-1",
            "uid": "u1",
            "ip": "10.0.0.1",
            "serviceAccount": "web",
            "services": ["web"],
        },
    ]
    assert namespaces["jobs"]["pods"] == [{"name": "batch-1", "uid": "u2"}]
    assert report["state"]["serviceAccountIssuer"] == issuer


POD = (
    "{namespace: shop, name: web-1, uid: 0b6c, serviceAccount: web, ip: 127.0.0.1, services: [web]}"
)
PROXY = "{namespace: shop, workload: web, instance: web-1, adminAddress: 127.0.0.1:15000}"


def test_the_static_file_may_list_pods(tmp_path: Path) -> None:
    path = tmp_path / "proxies.yaml"
    path.write_text(f"proxies:\n  - {PROXY}\npods:\n  - {POD}\n")
    loaded = load_file(path)
    assert [p.instance for p in loaded.proxies] == ["web-1"] == [p.instance for p in load(path)]
    assert loaded.pods == [PodInfo("shop", "web-1", "0b6c", "127.0.0.1", "web", services=("web",))]
    path.write_text(f"pods:\n  - {POD}\n")
    assert load_file(path).proxies == [] and len(load_file(path).pods) == 1


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        (f"pods:\n  - {POD.replace('uid: 0b6c, ', '')}\n", "pods[0].uid", "is required"),
        (f"pods:\n  - {POD.replace('127.0.0.1', 'localhost')}\n", "pods[0].ip", "IP address"),
        (f"pods:\n  - {POD.replace('shop', 'Shop')}\n", "pods[0].namespace", "DNS-1123"),
        (f"pods:\n  - {POD}\n  - {POD}\n", "pods[1].name", "listed twice"),
        (f"pods:\n  - {POD.replace('uid: 0b6c', 'uid: ' + 'x' * 65)}\n", "pods[0].uid", "64"),
        ("pods: {a: 1}\n", "pods", "must be a list of pods"),
        ("pod: []\n", "pod", "unknown key 'pod'"),
    ],
)
def test_pod_errors_name_the_field(tmp_path: Path, text: str, field: str, message: str) -> None:
    path = tmp_path / "proxies.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_file(path)
    assert info.value.field == field and message in info.value.message, str(info.value)


def test_a_static_agents_pods_verify_with_an_admin_registered_issuer(
    fleet: Fleet, tmp_path: Path
) -> None:
    """Outside Kubernetes: the pods come from the static file, the issuer from the admin."""
    issuer = TestIssuer("https://vm-issuer.example")
    pod = PodRef("shop", "vm-web-1", "web", services=("web",))
    gone = PodRef("shop", "vm-web-2", "web", services=("web",))
    fleet.create_cluster("static-pods")
    cluster_path = f"/v2/organizations/{ORG}/clusters/static-pods"
    body = ok(fleet.admin.get(cluster_path))
    body["workloadIdentity"] = {"issuers": [issuer.registration()]}
    ok(fleet.admin.put(cluster_path, json=body))
    proxies = tmp_path / "proxies.json"

    def write(*pods: PodRef) -> None:
        items: list[dict[str, Any]] = [{"namespace": p.namespace, **p.report()} for p in pods]
        proxies.write_text(json.dumps({"proxies": [], "pods": items}))

    write(pod, gone)
    agent = Agent(tmp_path, fleet.mgmt, "static-pods", fleet.credentials("static-pods"), proxies)
    fleet.agents.append(agent.start())
    wait_until(agent.ready, timeout=60, what="the static agent to connect")

    def pods() -> Any:
        namespaces = ok(fleet.admin.get(cluster_path)).get("namespaces") or []
        return {p["name"] for n in namespaces for p in n.get("pods", [])} or None

    assert wait_until(pods, timeout=30, what="the static pods") == {pod.name, gone.name}
    port = fleet.mgmt.grpc_port
    assert sign(port, ORG, "static-pods", issuer.token(pod), "shop", "web").not_after_unix
    write(pod)  # vm-web-2 is gone from the file: the next report drops it
    wait_until(lambda: pods() == {pod.name}, timeout=60, what="the next report")
    with pytest.raises(grpc.RpcError) as refused:
        sign(port, ORG, "static-pods", issuer.token(gone), "shop", "web")
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
