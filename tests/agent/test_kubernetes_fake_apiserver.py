"""Kubernetes discovery and pod logs against a FAKE Kubernetes API server.

A Kubernetes cluster cannot run here, so the API server is the one fake
(``fake_kube_api.py``, HTTPS with a test CA and a service-account token);
everything else is real: the agent process with ``--kubernetes``, mgmt-api,
and two Envoys standing in for two pods, on pod IPs 127.0.0.2 and 127.0.0.3
with the same admin port, exactly as pods share ``--admin-port``.
"""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agent.fake_kube_api import TOKEN, FakeKubeApi
from tests.agent.fleet import ORG, Agent, Fleet, wait_ok
from tests.mgmt_api.harness import ok
from tests.support.certs import CertificateAuthority
from tests.support.envoy import EnvoyProcess, minimal_bootstrap
from tests.support.processes import wait_until
from tests.support.workload_tokens import PodRef, TestIssuer, sign

PODS = {"web-7d9f-a": "127.0.0.2", "web-7d9f-b": "127.0.0.3"}
WEB = {"namespace": "shop", "workload": "web"}
# The cluster's service-account issuer, as the fake API server publishes it.
ISSUER = TestIssuer("https://kubernetes.default.svc.cluster.local")


def _shared_port() -> int:
    """A port free on both pod IPs (the admin port all pods share)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.2", 0))
            port = int(first.getsockname()[1])
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.3", port))
                except OSError:
                    continue
            return port
    raise RuntimeError("no port free on both addresses")


class Kube:
    def __init__(self) -> None:
        self.envoys: dict[str, EnvoyProcess] = {}
        self.agent: Agent | None = None
        self.api: FakeKubeApi | None = None
        self.uids: dict[str, str] = {}

    def start(self, fleet: Fleet, tmp: Path) -> None:
        ca = CertificateAuthority(tmp)
        server = ca.issue("kubernetes")
        credentials = tmp / "serviceaccount"
        credentials.mkdir()
        (credentials / "token").write_text(TOKEN + "\n")
        (credentials / "ca.crt").write_bytes(ca.path.read_bytes())
        self.api = api = FakeKubeApi(server.cert, server.key).start()
        api.issuer = ISSUER.registration()
        port = _shared_port()
        for pod, ip in PODS.items():
            config = minimal_bootstrap(ip, port)
            config["node"] = {"id": pod, "cluster": "web"}
            self.envoys[pod] = EnvoyProcess(config, directory=tmp / pod).start()
            labels = {"app": "web", "security.istio.io/tlsMode": "istio"}
            self.uids[pod] = api.add_pod("shop", pod, ip, labels, service_account="web")
            assert self.envoys[pod].log_path is not None
            api.log_files[pod] = self.envoys[pod].log_path  # type: ignore[assignment]
        api.add_pod(
            "shop", "web-7d9f-pending", None, {"app": "web", "security.istio.io/tlsMode": "istio"}
        )
        api.add_pod("shop", "db-0", "127.0.0.9", {"app": "db"})  # no sidecar: not selected
        api.services = [
            {
                "metadata": {"namespace": "shop", "name": "web"},
                "spec": {
                    "selector": {"app": "web"},
                    "clusterIP": "10.96.0.10",
                    "ports": [{"port": 80, "name": "http"}],
                },
            }
        ]
        fleet.create_cluster("kube")
        self.agent = Agent(
            tmp, fleet.mgmt, "kube", fleet.credentials("kube"), None,
            "--kubernetes", "--kube-api", api.url, "--kube-credentials-dir", str(credentials),
            "--admin-port", str(port), "--workload-label", "app",
        ).start()  # fmt: skip
        wait_until(self.agent.ready, timeout=60, what="the Kubernetes agent to connect")

    @property
    def fake(self) -> FakeKubeApi:
        assert self.api is not None
        return self.api

    def close(self) -> None:
        """Stops whatever was started, also after a failed start."""
        if self.agent is not None:
            self.agent.stop()
        for envoy in self.envoys.values():
            envoy.stop()
        if self.api is not None:
            self.api.stop()


@pytest.fixture(scope="module")
def kube(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    k = Kube()
    try:
        k.start(fleet, tmp_path_factory.mktemp("kube"))
        yield k
    finally:
        k.close()


def test_pods_by_selector_are_the_proxies(fleet: Fleet, kube: Kube) -> None:
    answer = wait_ok(
        fleet.admin,
        "POST",
        fleet.path("serverstats", "kube"),
        {**WEB, "filter": "^server.live$", "includeServerInfo": True},
    )
    ids = {i["instance"]: i["serverInfo"]["node"]["id"] for i in answer["instances"]}
    assert ids == {pod: pod for pod in PODS}  # each pod's own Envoy, at podIP:admin-port
    assert (
        "/api/v1/pods",
        {"labelSelector": ["security.istio.io/tlsMode=istio"]},
    ) in kube.fake.requests


def test_inventory_from_the_api(fleet: Fleet, kube: Kube) -> None:
    def reported() -> Any:
        cluster = ok(fleet.admin.get(f"/v2/organizations/{ORG}/clusters/kube?fetchWorkloads=true"))
        return cluster if cluster.get("state", {}).get("provider") == "kubernetes" else None

    cluster = wait_until(reported, timeout=30, what="the inventory")
    assert cluster["state"]["kubernetesVersion"] == "v1.31.0-fake"
    shop = {n["name"]: n for n in cluster["namespaces"]}["shop"]
    [web] = shop["services"]
    assert web["kubernetesServiceIp"] == "10.96.0.10" and web["ports"] == [
        {"number": 80, "name": "http"}
    ]
    assert sorted(w["name"] for w in web["workloads"]) == sorted(PODS)
    assert "kube-system" in {n["name"] for n in cluster["namespaces"]}


def test_pod_logs_tail_and_follow(fleet: Fleet, kube: Kube) -> None:
    pod = "web-7d9f-b"
    response = fleet.admin.post(
        fleet.path("streamlogs", "kube"), json={**WEB, "instance": pod, "tailLines": 2}
    )
    lines = [json.loads(raw) for raw in response.text.splitlines()]
    log_path = kube.envoys[pod].log_path
    assert log_path is not None
    assert [line["line"] for line in lines] == log_path.read_text().splitlines()[-2:]
    path, query = [r for r in kube.fake.requests if r[0].endswith("/log")][-1]
    assert path == f"/api/v1/namespaces/shop/pods/{pod}/log"
    assert query["container"] == ["istio-proxy"] and query["tailLines"] == ["2"]

    envoy = kube.envoys[pod]
    envoy.admin("POST", "/logging?admin=debug")
    marker = f"kube-{uuid.uuid4().hex}"
    body = {**WEB, "instance": pod, "follow": True, "tailLines": 0}
    with httpx.Client(base_url=fleet.mgmt.url, auth=("admin", "admin-password-for-tests")) as c:
        with c.stream("POST", fleet.path("streamlogs", "kube"), json=body, timeout=60) as stream:
            wait_until(lambda: kube.fake.open_streams == 1, what="the pod log stream to open")
            envoy.admin("GET", f"/ready?{marker}")
            for raw in stream.iter_lines():
                if marker in json.loads(raw)["line"]:
                    break
    # the client left: the agent closed the pod log stream
    wait_until(lambda: kube.fake.open_streams == 0, timeout=30, what="the pod log stream to close")


def test_inventory_reports_pods_and_issuer_of_the_fake_api_server_and_their_tokens_verify(
    fleet: Fleet, kube: Kube
) -> None:
    """Pods (uid, IP, service account, services by selector) and the issuer read from the
    FAKE API server's discovery reach mgmt-api, and a pod's token then gets a certificate."""

    def reported() -> Any:
        cluster = ok(fleet.admin.get(f"/v2/organizations/{ORG}/clusters/kube"))
        return cluster if cluster.get("state", {}).get("serviceAccountIssuer") else None

    cluster = wait_until(reported, timeout=30, what="the inventory with the issuer")
    assert cluster["state"]["serviceAccountIssuer"] == ISSUER.registration()
    pods = {p["name"]: p for p in {n["name"]: n for n in cluster["namespaces"]}["shop"]["pods"]}
    for pod, ip in PODS.items():
        assert pods[pod] == {
            "name": pod,
            "uid": kube.uids[pod],
            "ip": ip,
            "serviceAccount": "web",
            "services": ["web"],
        }
    assert "services" not in pods["db-0"]  # no service selects app=db
    assert "ip" not in pods["web-7d9f-pending"]
    assert ("/openid/v1/jwks", {}) in kube.fake.requests  # jwks_uri's path, on the API server
    web = PodRef("shop", "web-7d9f-a", "web", uid=kube.uids["web-7d9f-a"])
    answer = sign(fleet.mgmt.grpc_port, ORG, "kube", ISSUER.token(web), "shop", "web")
    assert answer.not_after_unix > 0
