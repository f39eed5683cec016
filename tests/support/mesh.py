"""A mesh on loopback: workloads (tiny HTTP apps) behind real sidecar Envoys, each run by
its pod-local sidecar agent (``python -m sidecar_agent``, as the injected container runs it).

:class:`MeshStack` extends the gateway stack (mgmt-api, and unless
``services=False`` redis, ratelimit, extauthz) with apps served by one
in-process HTTP server per workload (real sockets; each answers with its own
name and the headers the sidecar passed) and a sidecar agent per workload,
which makes the workload's key, has it signed with the workload's token,
relays ADS and starts Envoy (admin on a Unix socket). No Kubernetes API server
runs here: the tokens are minted by a test issuer
(:class:`tests.support.workload_tokens.TestIssuer`) that the stack registers
on the cluster (``workloadIdentity.issuers``), and the pods are reported over
the cluster agent's inventory API with the agent's key.
"""

from __future__ import annotations

import json
import queue
import re
import shutil
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

import grpc
import httpx
from envoy.config.core.v3 import base_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import json_format, struct_pb2

from meshplane import sidecar_contract as sc
from meshplane import workload_contract
from mgmt_api.auth.tokens import sign_service_account
from sidecar_agent.sds import SECRET_TYPE
from tests.mgmt_api.harness import MgmtServer, ok
from tests.support.gateway import (
    BASE,
    CLUSTER,
    CLUSTER_PATH,
    ORG,
    TEST_DEADLINES,
    GatewayStack,
)
from tests.support.net import free_port
from tests.support.processes import Service, in_parallel, wait_until
from tests.support.workload_tokens import PodRef, TestIssuer

CLUSTER_TYPE = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
AGENT_PATH = f"{CLUSTER_PATH}/serviceaccounts/agent"
EXPIRY_METRIC = "meshplane_sidecar_certificate_expiry_timestamp_seconds"
AGENT_EXPIRY_METRIC = "meshplane_sidecar_agent_certificate_expiry_timestamp_seconds"
#: The issuer the test cluster's admin registers (``cluster.workloadIdentity.issuers``).
ISSUER_URL = "https://issuer.mesh.test"


def ok_text(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.text


#: The trust domain of the test cluster, which sets none: the documented default.
TRUST_DOMAIN = f"{CLUSTER}.{ORG}.mesh.local"


class _App(BaseHTTPRequestHandler):
    """Answers every GET with {"app": NAME, "headers": {...}}."""

    def do_GET(self) -> None:
        body = json.dumps(
            {"app": self.server.app_name, "headers": dict(self.headers.items())}  # type: ignore[attr-defined]
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        del format, args


class Plane(Protocol):
    """What a :class:`Workload` needs of its stack."""

    tmp: Path
    issuer: TestIssuer

    @property
    def control_plane(self) -> str: ...
    def agent_args(self) -> list[str]: ...
    def agent_env(self) -> dict[str, str] | None: ...


def report_pods(mgmt: MgmtServer, credentials: Path, pods: list[PodRef]) -> None:
    """Report ``pods`` (``pods`` of each namespace) with the cluster agent's key, as it does."""
    secret = json.loads(credentials.read_text())
    token = sign_service_account(
        json.loads(secret["jwk"]), secret["serviceAccountFqn"], time.time(), 600
    )
    namespaces: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        namespaces.setdefault(pod.namespace, []).append(pod.report())
    body = {
        "namespaces": [{"name": ns, "pods": items} for ns, items in sorted(namespaces.items())],
        "state": {"provider": "static"},
    }
    with mgmt.client(headers={"Authorization": f"Bearer {token}"}) as client:
        ok(client.put(f"/v2/{secret['clusterFqn']}/inventory", json=body))


class Workload:
    """One app, its sidecar agent (and so its Envoy), and a client of the outbound listener."""

    def __init__(self, stack: Plane, name: str, namespace: str, account: str) -> None:
        self.name, self.namespace, self.account = name, namespace, account
        self.stack = stack
        self.app = ThreadingHTTPServer(("127.0.0.1", 0), _App)
        self.app.app_name = name  # type: ignore[attr-defined]
        self.app.daemon_threads = True
        self._thread = threading.Thread(target=self.app.serve_forever, daemon=True)
        self._thread.start()
        self.node = sc.SidecarNode(
            ORG,
            CLUSTER,
            f"{namespace}-{name}",
            namespace,
            account,
            name,
            self.app.server_address[1],
            "127.0.0.1",
            free_port(),
            free_port(),
        )
        self.pod = PodRef(namespace, self.node.instance, account, services=(name,))
        self.files = stack.tmp / self.node.instance  # logs and the token
        self.files.mkdir(exist_ok=True)
        self.token_file = self.files / "token"
        # Socket paths are at most 107 bytes: a short directory of their own.
        self.sockets = sc.Sockets(tempfile.mkdtemp(prefix="mp-"))
        self.metrics_port = free_port()
        self.agent: Service | None = None
        self.client = httpx.Client(
            base_url=f"http://127.0.0.1:{self.node.outbound_port}", timeout=10
        )

    @property
    def log(self) -> Path:
        return self.files / "agent.log"

    @property
    def envoy_log(self) -> Path:
        return self.files / "envoy.log"

    @property
    def stdout(self) -> Path:
        """The agent's stdout, which its Envoy inherits: the sidecar's decision lines."""
        return self.files / "stdout"

    def argv(self, extra_args: tuple[str, ...] = (), agent_args: tuple[str, ...] = ()) -> list[str]:
        """``python -m`` arguments of the sidecar agent (the injected container's command);
        ``agent_args`` are its own extra flags, ``extra_args`` Envoy's."""
        node = self.node
        args = ["sidecar_agent", "--control-plane", self.stack.control_plane, *agent_args]
        args += self.stack.agent_args()
        args += ["--cluster", node.node_cluster, "--service", node.service]
        args += ["--app-port", str(node.app_port), "--node-id", node.instance]
        args += ["--inbound", f"{node.inbound_host}:{node.inbound_port}"]
        args += ["--outbound-port", str(node.outbound_port)]
        args += ["--token-file", str(self.token_file), "--socket-dir", self.sockets.directory]
        args += ["--listen", f"127.0.0.1:{self.metrics_port}", "--envoy-log", str(self.envoy_log)]
        envoy = ("--concurrency", "1", "--file-flush-interval-msec", "50", *extra_args)
        return args + [f"--envoy-arg={a}" for a in envoy]

    def start(self, extra_args: tuple[str, ...] = (), agent_args: tuple[str, ...] = ()) -> Workload:
        """Mint the pod's token, start its agent; ``extra_args`` go to Envoy, ``agent_args``
        to the agent. Returns once its Envoy's admin socket answers."""
        return self.spawn(extra_args, agent_args).wait_started()

    def spawn(self, extra_args: tuple[str, ...] = (), agent_args: tuple[str, ...] = ()) -> Workload:
        """:meth:`start` without the wait (:meth:`wait_started`)."""
        self.stack.issuer.write(self.token_file, self.pod)
        self.agent = Service(
            self.argv(extra_args, agent_args),
            Path(self.sockets.admin),
            self.log,
            self.stack.agent_env(),
            stdout=self.stdout,
        ).spawn()
        return self

    def wait_started(self) -> Workload:
        """Wait for the admin socket of the Envoy that :meth:`spawn`'s agent starts."""
        assert self.agent is not None
        self.agent.wait_started()
        return self

    def call(
        self, target: Workload, path: str = "/", token: str | None = None, **kw: Any
    ) -> httpx.Response:
        """GET ``path`` of ``target`` by its service name, through this sidecar
        (with ``Authorization: Bearer token`` when given)."""
        headers = {"host": f"{target.name}.{target.namespace}", **kw.pop("headers", {})}
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        return self.client.get(path, headers=headers, **kw)

    def spiffe_id(self) -> str:
        return sc.spiffe_id(TRUST_DOMAIN, self.namespace, self.account)

    def admin(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """Envoy's admin API, on its Unix socket (the only place it listens)."""
        transport = httpx.HTTPTransport(uds=self.sockets.admin)
        with httpx.Client(transport=transport, base_url="http://envoy", timeout=10) as client:
            return client.request(method, path, **kw)

    def certificates(self) -> list[dict[str, Any]]:
        """The certificates (chains' leaves) the sidecar's Envoy holds (admin ``/certs``)."""
        contexts = self.admin("GET", "/certs").json().get("certificates", [])
        return [c for ctx in contexts for c in ctx.get("cert_chain", [])]

    def serials(self) -> set[str]:
        """Serial numbers of the workload certificates the sidecar serves with."""
        return {c["serial_number"] for c in self.certificates()}

    def envoy_pid(self) -> int:
        """The pid of the agent's Envoy (its only child process)."""
        assert self.agent is not None and self.agent.proc is not None
        pid = self.agent.proc.pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        assert len(children) == 1, children
        return int(children[0])

    def agent_metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).text

    def stop(self) -> Any:
        """SIGTERM to the agent (it stops Envoy and removes its sockets); its exit code."""
        self.client.close()
        code = self.agent.stop() if self.agent is not None else None
        self.agent = None
        self.app.shutdown()
        self.app.server_close()
        shutil.rmtree(self.sockets.directory, ignore_errors=True)
        return code


class RawAds:
    """A raw ADS client (not Envoy): one stream with ``token``, announcing ``node``.

    What an attacker in a pod can run against mgmt-api's gRPC port.
    """

    def __init__(self, channel: grpc.Channel, token: str | None, node: sc.SidecarNode) -> None:
        self._requests: queue.Queue[discovery_pb2.DiscoveryRequest | None] = queue.Queue()
        metadata = struct_pb2.Struct()
        json_format.ParseDict(node.metadata(), metadata)
        envoy_node = base_pb2.Node(id=node.instance, cluster=node.node_cluster, metadata=metadata)
        self._requests.put(discovery_pb2.DiscoveryRequest(node=envoy_node, type_url=CLUSTER_TYPE))
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
        headers = () if token is None else (("authorization", f"Bearer {token}"),)
        self.responses = stub.StreamAggregatedResources(
            iter(self._requests.get, None), metadata=headers, timeout=60
        )

    def secrets(self) -> list[secret_pb2.Secret]:
        """Ask for the secrets the sidecar configuration names; the first answer's."""
        self._requests.put(
            discovery_pb2.DiscoveryRequest(
                type_url=SECRET_TYPE,
                resource_names=[workload_contract.SVID_SECRET, workload_contract.CA_SECRET],
            )
        )
        for response in self.responses:
            if response.type_url == SECRET_TYPE:
                out = []
                for item in response.resources:
                    secret = secret_pb2.Secret()
                    item.Unpack(secret)
                    out.append(secret)
                return out
        return []

    def close(self) -> None:
        self._requests.put(None)
        self.responses.cancel()


class MeshStack(GatewayStack):
    """The gateway stack plus workloads behind sidecars."""

    def __init__(
        self,
        tmp: Path,
        certificate_ttl: str | None = None,
        database_url: str | None = None,
        services: bool = True,
    ) -> None:
        """``certificate_ttl``: the workload certificates' lifetime (default: mgmt-api's);
        ``database_url``: two replicas sharing PostgreSQL (:class:`GatewayStack`'s split);
        ``services=False``: only mgmt-api and the sidecars (:class:`GatewayStack`)."""
        self.workloads: list[Workload] = []
        #: Pods the cluster's inventory reports beyond the workloads' (an attacker's).
        self.extra_pods: list[PodRef] = []
        self.issuer = TestIssuer(ISSUER_URL)
        env = {"MESHPLANE_SIDECAR_CERT_TTL": certificate_ttl} if certificate_ttl else None
        super().__init__(tmp, database_url=database_url, mgmt_env=env, services=services)
        try:
            self.cluster_spec(
                **TEST_DEADLINES, workloadIdentity={"issuers": [self.issuer.registration()]}
            )
        except BaseException:
            self.close()
            raise

    def workload(
        self,
        name: str,
        namespace: str,
        account: str = "default",
        extra_args: tuple[str, ...] = (),
        agent_args: tuple[str, ...] = (),
    ) -> Workload:
        """A workload, its pod in the inventory, and its sidecar agent; ``extra_args``: the
        sidecar Envoy's extra flags, ``agent_args`` its agent's."""
        workload = Workload(self, name, namespace, account)
        self.workloads.append(workload)
        self.report_pods()
        return workload.start(extra_args, agent_args)

    def add(self, *workloads: Workload) -> list[Workload]:
        """Start ``workloads`` (made with this stack or a view of it) side by side, their
        pods reported first in one inventory report."""
        self.workloads += workloads
        self.report_pods()
        for workload in workloads:
            workload.spawn()
        in_parallel(workload.wait_started for workload in workloads)
        return list(workloads)

    def workloads_started(self, *specs: tuple[str, str, str]) -> list[Workload]:
        """Workloads ``(name, namespace, account)`` started side by side (:meth:`add`)."""
        return self.add(*(Workload(self, *spec) for spec in specs))

    def remove(self, workload: Workload) -> None:
        """Stop ``workload`` and delete its pod from the inventory."""
        workload.stop()
        self.workloads.remove(workload)
        self.report_pods()

    # -- the cluster agent's part: the inventory --------------------------

    @property
    def control_plane(self) -> str:
        return f"grpc://127.0.0.1:{self.attach.grpc_port}"

    def agent_args(self) -> list[str]:
        return []

    def agent_env(self) -> dict[str, str] | None:
        return None

    def pods(self) -> list[PodRef]:
        return [w.pod for w in self.workloads] + self.extra_pods

    def report_pods(self) -> None:
        """Report every pod (``pods`` of each namespace), as the cluster agent does."""
        assert self.mgmt is not None
        report_pods(self.mgmt, self.credentials, self.pods())

    # -- security objects over REST (tenant ``t``) ------------------------

    def workspace(self, name: str, *namespaces: str) -> str:
        """Workspace ``name`` of tenant ``t`` selecting ``CLUSTER/ns`` for each namespace."""
        if self.admin.get(f"{BASE}/tenants/t").status_code == 404:
            self.put(f"{BASE}/tenants", "t", "tenant", {})
        selector = {"names": [f"{CLUSTER}/{ns}" for ns in namespaces]}
        self.put(f"{BASE}/tenants/t/workspaces", name, "workspace", {"namespaceSelector": selector})
        return f"{BASE}/tenants/t/workspaces/{name}"

    def group(self, workspace: str, name: str, *namespaces: str) -> str:
        """A security group of ``workspace``; without namespaces it selects the workspace's."""
        body: dict[str, Any] = {}
        if namespaces:
            body["namespaceSelector"] = {"names": [f"{CLUSTER}/{ns}" for ns in namespaces]}
        self.put(f"{workspace}/securitygroups", name, "securityGroup", body)
        return f"{workspace}/securitygroups/{name}"

    def setting(self, group: str, authorization: dict[str, Any], name: str = "s") -> None:
        """Create or replace the group's SecuritySetting ``name``."""
        self.put(f"{group}/settings", name, "securitySetting", {"authorization": authorization})

    def sidecars_converged(self, timeout: float = 60) -> dict[str, Any]:
        """Every workload's sidecar is connected and ACKed the desired sidecar version."""

        def done() -> dict[str, Any] | None:
            status = self.status()
            desired = status["desiredVersions"].get(sc.SIDECAR_KIND)
            sidecars = [
                i for i in status["instances"] if i["kind"] == sc.SIDECAR_KIND and i["connected"]
            ]
            if len(sidecars) != len([w for w in self.workloads if w.agent is not None]):
                return None
            if all(i["appliedVersion"] == desired and i["lastResult"] == "ACK" for i in sidecars):
                return status
            return None

        return wait_until(done, timeout, "every sidecar to ACK the desired version")

    def certificate_expiries(self) -> dict[str, float]:
        """instance → the expiry gauge mgmt-api exports for its sidecar's certificate."""
        text = ok_text(self.admin.get("/metrics"))
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith(EXPIRY_METRIC + "{"):
                labels, _, value = line.rpartition(" ")
                found = dict(re.findall(r'(\w+)="([^"]*)"', labels))
                assert found["cluster"] == f"{ORG}/{CLUSTER}", line
                out[found["instance"]] = float(value)
        return out

    def close(self) -> None:
        in_parallel(workload.stop for workload in self.workloads)
        super().close()


class CallLoop:
    """Calls each (caller, callee) pair in a loop on a thread, recording every failure.

    The load of the tests that change something under running traffic (a
    certificate or CA rotation, a control-plane restart): use it as a context
    manager, then assert ``failures`` is empty and ``calls`` grew.
    """

    def __init__(self, pairs: list[tuple[Workload, Workload]], pause: float = 0.02) -> None:
        self.pairs, self.pause = pairs, pause
        self.done, self.failures = threading.Event(), list[str]()
        self.calls = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    @classmethod
    def both_ways(cls, a: Workload, c: Workload) -> CallLoop:
        return cls([(a, c), (c, a)])

    def _run(self) -> None:
        while not self.done.is_set():
            for caller, callee in self.pairs:
                where = f"{caller.name}→{callee.name}"
                try:
                    response = caller.call(callee)
                    if response.status_code != 200:
                        self.failures.append(
                            f"{where}: {response.status_code} {response.text[:200]}"
                        )
                except Exception as exc:  # every failure counts, whatever it is
                    self.failures.append(f"{where}: {exc!r}")
                self.calls += 1
            time.sleep(self.pause)  # pacing of the load, not a wait for a condition

    def more(self, n: int, timeout: float = 60) -> None:
        """Wait until ``n`` more calls were made."""
        target = self.calls + n
        wait_until(lambda: self.calls >= target, timeout, f"{n} more calls")

    def __enter__(self) -> CallLoop:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(timeout=30)
