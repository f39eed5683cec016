"""Sidecars are diagnosable like gateways, and only by the cluster agent.

One stack, every part real: mgmt-api, a sidecar Envoy under its pod
agent (``--diagnostics-caller``: the diagnostics port accepts only the
cluster agent's mesh certificate; ``--prometheus-port``: metrics only), the
cluster agent (static-file discovery, ``diagnosticsAddress`` entries) with
its own mesh certificate from Sign (``--workload-token``), and ``meshctl``
as a user runs it. Then the hostile side: no client certificate, a pod's
real mesh certificate of another identity, and the agent's identity asking
for endpoints outside the allow-list.
"""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
import yaml

from meshplane.proto.workload.v1 import workload_pb2, workload_pb2_grpc
from sidecar_agent import identity
from tests.dashboards.prometheus import Prometheus
from tests.meshctl.conftest import Meshctl
from tests.mgmt_api.harness import ADMIN_PASSWORD
from tests.support.gateway import CLUSTER, ORG
from tests.support.mesh import TRUST_DOMAIN, MeshStack, Workload
from tests.support.net import free_port
from tests.support.processes import Service, wait_until
from tests.support.workload_tokens import PodRef

SHIPPED = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "prometheus.yml"
SIDECARS_JOB = "meshplane-sidecars"
AGENT_POD = PodRef("meshplane", "meshplane-agent-0", "meshplane-agent")
#: A pod of the mesh with a real workload certificate, calling the diagnostics port.
ATTACKER = PodRef("shop", "attacker-0", "attacker")
CALLER = f"{AGENT_POD.namespace}/{AGENT_POD.service_account}"
WHERE = ("-n", "shop", "--cluster", CLUSTER, "--org", ORG)
# The stack (mgmt-api, a sidecar, the agent, meshctl's login) starts once for the module.
pytestmark = pytest.mark.timeout(300)


@dataclass
class Pod:
    workload: Workload
    diagnostics: int
    prometheus: int


@dataclass
class Mesh:
    stack: MeshStack
    pods: dict[str, Pod]
    agent: Service
    agent_port: int
    ctl: Meshctl
    proxies_file: Path


def _pod(stack: MeshStack, name: str) -> Pod:
    diagnostics, prometheus = free_port(), free_port()
    flags: tuple[str, ...] = (
        "--diagnostics-caller",
        CALLER,
        "--diagnostics-port",
        str(diagnostics),
    )
    flags += ("--prometheus-port", str(prometheus))
    return Pod(stack.workload(name, "shop", name, agent_args=flags), diagnostics, prometheus)


def _static_file(stack: MeshStack, pods: dict[str, Pod], path: Path) -> Path:
    """What the agent discovers: the sidecars' diagnostics ports and every pod."""
    proxies = [
        {
            "namespace": "shop",
            "workload": name,
            "instance": pod.workload.node.instance,
            "diagnosticsAddress": f"127.0.0.1:{pod.diagnostics}",
        }
        for name, pod in pods.items()
    ]
    report = [{"namespace": p.namespace, **p.report()} for p in stack.pods()]
    path.write_text(json.dumps({"proxies": proxies, "pods": report}))
    return path


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    tmp = tmp_path_factory.mktemp("sidecar-diag")
    stack = MeshStack(tmp, services=False)
    agent: Service | None = None
    try:
        pods = {name: _pod(stack, name) for name in ("web",)}
        stack.extra_pods += [AGENT_POD, ATTACKER]
        stack.report_pods()
        token = stack.issuer.write(tmp / "agent-token", AGENT_POD)
        port = free_port()
        args = ["agent", "--control-plane", stack.control_plane, "--cluster", f"{ORG}/{CLUSTER}"]
        args += ["--credentials", str(stack.credentials), "--listen", f"127.0.0.1:{port}"]
        args += ["--static-proxies", str(_static_file(stack, pods, tmp / "proxies.json"))]
        args += ["--workload-token", str(token)]  # the default trust domain
        args += ["--max-backoff", "1"]
        agent = Service(args, port, tmp / "agent.log").start()
        wait_until(lambda: _ready(port), timeout=60, what="the agent's tunnel")
        assert stack.mgmt is not None
        ctl = Meshctl(tmp / "home", stack.mgmt.url)
        ctl.ok(
            "login", "--server", stack.mgmt.url, "--username", "admin", "--password-stdin",
            input=ADMIN_PASSWORD + "\n",
        )  # fmt: skip
        stack.sidecars_converged()
        yield Mesh(stack, pods, agent, port, ctl, tmp / "proxies.json")
    finally:
        if agent is not None:
            agent.stop()
        stack.close()


def _ok_eventually(mesh: Mesh, *args: str) -> str:
    """``meshctl`` until it exits 0: the agent signs its certificate once connected."""

    def attempt() -> str | None:
        done = mesh.ctl.run(*args)
        return done.stdout if done.returncode == 0 else None

    result: str = wait_until(attempt, timeout=60, what=f"meshctl {' '.join(args)}")
    return result


def test_meshctl_reads_a_sidecars_stats_config_dump_and_clusters(mesh: Mesh) -> None:
    out = _ok_eventually(mesh, "proxy", "stats", "web", *WHERE, "--filter", r"^server\.live$")
    (instance,) = json.loads(out)["instances"]
    assert instance["instance"] == "shop-web"
    assert instance["stats"] == [{"name": "server.live", "value": 1}]
    metrics = httpx.get(f"http://127.0.0.1:{mesh.agent_port}/metrics", timeout=10).text
    (expiry,) = [
        float(line.split()[1]) for line in metrics.splitlines()
        if line.startswith("meshplane_agent_certificate_expiry_timestamp_seconds ")
    ]  # fmt: skip
    assert expiry > time.time()

    dump = mesh.ctl.ok("proxy", "config-dump", "web", *WHERE)
    assert "PRIVATE KEY" not in dump
    (answer,) = json.loads(dump)["instances"]
    kinds = {c["@type"].rsplit(".", 1)[-1] for c in answer["configDump"]["configs"]}
    assert {"ListenersConfigDump", "ClustersConfigDump", "SecretsConfigDump"} <= kinds
    assert "meshplane_diagnostics" in dump  # the listener it was read through

    upstream = json.loads(mesh.ctl.ok("proxy", "stats", "web", *WHERE, "--upstream"))
    (answer,) = upstream["instances"]
    names = {c["name"] for c in answer["clusterStats"]["cluster_statuses"]}
    assert "meshplane_sds" in names and "meshplane_admin" in names


def _sign(mesh: Mesh, pod: PodRef) -> tuple[str, str]:
    """A real mesh certificate of ``pod`` (in the inventory), as its sidecar agent gets one."""
    key = identity.new_key()
    csr = identity.csr_pem(
        key, f"spiffe://{TRUST_DOMAIN}/ns/{pod.namespace}/sa/{pod.service_account}"
    )
    token = mesh.stack.issuer.token(pod)
    with grpc.insecure_channel(mesh.stack.control_plane.removeprefix("grpc://")) as channel:
        stub = workload_pb2_grpc.WorkloadCertificatesStub(channel)  # type: ignore[no-untyped-call]
        answer = stub.Sign(
            workload_pb2.SignRequest(csr_pem=csr, cluster=f"{ORG}/{CLUSTER}", instance=pod.name),
            metadata=(("authorization", f"Bearer {token}"),),
            timeout=30,
        )
    return answer.certificate_chain_pem + identity.key_pem(key), "".join(answer.trust_bundle_pem)


def _context(tmp: Path, chain_and_key: str | None, bundle: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.load_verify_locations(cadata=bundle)
    if chain_and_key is not None:
        pem = tmp / "client.pem"
        pem.write_text(chain_and_key)
        context.load_cert_chain(str(pem))
    return context


def _get(port: int, context: ssl.SSLContext, method: str, path: str) -> int:
    with httpx.Client(verify=context, timeout=10) as client:
        return client.request(method, f"https://127.0.0.1:{port}{path}").status_code


def test_a_hostile_caller_gets_nothing(mesh: Mesh, tmp_path: Path) -> None:
    port = mesh.pods["web"].diagnostics
    stolen, bundle = _sign(mesh, ATTACKER)

    # Plain HTTP: no answer at all.
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/stats", timeout=10)
    # TLS without a client certificate, and with a real mesh certificate of another id:
    # refused in the handshake.
    for credential in (None, stolen):
        with pytest.raises(httpx.HTTPError):
            _get(port, _context(tmp_path, credential, bundle), "GET", "/stats")
    # The agent's identity: the allow-list, and nothing else.
    agent, _ = _sign(mesh, AGENT_POD)
    context = _context(tmp_path, agent, bundle)
    assert _get(port, context, "GET", "/server_info") == 200
    for method, path in (("GET", "/certs"), ("POST", "/quitquitquit"), ("POST", "/stats"),
                         ("POST", "/healthcheck/fail"), ("GET", "/stats/../certs")):  # fmt: skip
        assert _get(port, context, method, path) == 404, (method, path)
    assert mesh.pods["web"].workload.admin("GET", "/ready").status_code == 200


def test_the_metrics_port_serves_prometheus_stats_only(mesh: Mesh) -> None:
    port = mesh.pods["web"].prometheus
    answer = httpx.get(f"http://127.0.0.1:{port}/stats/prometheus", timeout=10)
    assert answer.status_code == 200 and "envoy_server_live" in answer.text
    for path in ("/stats", "/config_dump", "/certs", "/clusters"):
        assert httpx.get(f"http://127.0.0.1:{port}{path}", timeout=10).status_code == 404
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.sendall(b"POST /quitquitquit HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        assert raw.recv(64).startswith(b"HTTP/1.1 404")


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian's prometheus package")
def test_prometheus_scrapes_the_sidecar_with_the_shipped_job(mesh: Mesh, tmp_path: Path) -> None:
    shipped = yaml.safe_load(SHIPPED.read_text())
    (job,) = [j for j in shipped["scrape_configs"] if j["job_name"] == SIDECARS_JOB]
    job["static_configs"] = [
        {"targets": [f"127.0.0.1:{mesh.pods['web'].prometheus}"], "labels": {"workload": "web"}}
    ]
    prometheus = Prometheus(tmp_path, [job])
    try:
        prometheus.wait_targets_up({SIDECARS_JOB}, timeout=90)
        live = f'envoy_server_live{{job="{SIDECARS_JOB}",workload="web"}}'
        (series,) = wait_until(lambda: prometheus.query(live) or None, 30, what=live)
        assert series["value"][1] == "1"
    finally:
        prometheus.close()


def test_a_connected_sidecar_the_agent_does_not_list_is_explained(mesh: Mesh) -> None:
    listed = mesh.proxies_file.read_text()
    document = json.loads(listed)
    mesh.proxies_file.write_text(json.dumps({**document, "proxies": []}))
    try:

        def refused() -> str | None:
            done = mesh.ctl.run("proxy", "stats", "web", *WHERE)
            return done.stderr if done.returncode != 0 else None

        error = wait_until(refused, timeout=60, what="the agent to forget the sidecar")
        assert "no proxy of workload shop/web is known" in error
        assert "1 sidecar(s) of service web.shop are connected (shop-web)" in error
        assert "--workload-token" in error
    finally:
        mesh.proxies_file.write_text(listed)
