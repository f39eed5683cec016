"""A mesh on loopback: workloads (tiny HTTP apps) behind real sidecar Envoys over ADS.

:class:`MeshStack` extends the gateway stack (mgmt-api, redis, ratelimit,
extauthz) with apps served by one in-process HTTP server per workload (real
sockets; each answers with its own name and the headers the sidecar passed)
and a sidecar Envoy per workload booted from
:func:`meshplane.sidecar_contract.bootstrap`.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from meshctl import sidecar as sidecar_cli
from meshplane import sidecar_contract as sc
from tests.mgmt_api.harness import ok
from tests.support.envoy import EnvoyProcess
from tests.support.gateway import BASE, CLUSTER, CLUSTER_PATH, ORG, GatewayStack
from tests.support.net import free_port
from tests.support.processes import wait_until

AGENT_PATH = f"{CLUSTER_PATH}/serviceaccounts/agent"
EXPIRY_METRIC = "meshplane_sidecar_certificate_expiry_timestamp_seconds"


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


class Workload:
    """One app, its sidecar and a client of the sidecar's outbound listener."""

    def __init__(
        self,
        stack: MeshStack,
        name: str,
        namespace: str,
        account: str,
        credentials: Path | None = None,
    ) -> None:
        self.name, self.namespace, self.account = name, namespace, account
        self.credentials = credentials or stack.credentials
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
        self.envoy: EnvoyProcess | None = None
        self.client = httpx.Client(
            base_url=f"http://127.0.0.1:{self.node.outbound_port}", timeout=10
        )
        self.stack = stack

    def start(self, extra_args: tuple[str, ...] = ()) -> Workload:
        """Start the sidecar; ``extra_args`` go to Envoy (``--disable-extensions``...)."""
        # What `meshctl sidecar bootstrap` prints, from the cluster's credentials.
        node = self.node
        doc = sidecar_cli.render(
            cluster=node.node_cluster,
            credentials=self.credentials,
            ads=f"grpc://127.0.0.1:{self.stack.attach.grpc_port}",
            namespace=node.namespace,
            service_account=node.service_account,
            service=node.service,
            app_port=node.app_port,
            node_id=node.instance,
            inbound=f"{node.inbound_host}:{node.inbound_port}",
            outbound_port=node.outbound_port,
            admin=f"127.0.0.1:{free_port()}",
        )
        self.envoy = EnvoyProcess(
            doc, directory=self.stack.tmp / self.node.instance, extra_args=extra_args
        ).start()
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

    def certificates(self) -> list[dict[str, Any]]:
        """The certificates (chains' leaves) the sidecar's Envoy holds (admin ``/certs``)."""
        assert self.envoy is not None
        contexts = self.envoy.admin("GET", "/certs").json().get("certificates", [])
        return [c for ctx in contexts for c in ctx.get("cert_chain", [])]

    def serials(self) -> set[str]:
        """Serial numbers of the workload certificates the sidecar serves with."""
        return {c["serial_number"] for c in self.certificates()}

    def stop(self) -> None:
        self.client.close()
        if self.envoy is not None:
            self.envoy.stop()
        self.app.shutdown()
        self.app.server_close()


class MeshStack(GatewayStack):
    """The gateway stack plus workloads behind sidecars."""

    def __init__(self, tmp: Path, certificate_ttl: str | None = None) -> None:
        """``certificate_ttl``: the workload certificates' lifetime (default: mgmt-api's)."""
        self.workloads: list[Workload] = []
        env = {"MESHPLANE_SIDECAR_CERT_TTL": certificate_ttl} if certificate_ttl else None
        super().__init__(tmp, mgmt_env=env)

    def workload(
        self,
        name: str,
        namespace: str,
        account: str = "default",
        credentials: Path | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> Workload:
        """A workload and its sidecar; ``credentials``: another agent key's file,
        ``extra_args``: the sidecar Envoy's extra flags."""
        workload = Workload(self, name, namespace, account, credentials)
        self.workloads.append(workload)
        return workload.start(extra_args)

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
            if len(sidecars) != len([w for w in self.workloads if w.envoy is not None]):
                return None
            if all(i["appliedVersion"] == desired and i["lastResult"] == "ACK" for i in sidecars):
                return status
            return None

        return wait_until(done, timeout, "every sidecar to ACK the desired version")

    def new_agent_key(self) -> tuple[str, Path]:
        """A second key of the cluster's agent account: (key id, a credentials file)."""
        created = ok(self.admin.post(f"{AGENT_PATH}/keys", params={"keyEncoding": "JWK"}))
        path = self.tmp / f"credentials-{created['id']}.json"
        doc = {
            "clusterFqn": CLUSTER_PATH.removeprefix("/v2/"),
            "serviceAccountFqn": AGENT_PATH.removeprefix("/v2/"),
            "keyId": created["id"],
            "jwk": json.loads(created["privateKey"]),
        }
        path.write_text(json.dumps(doc))
        return created["id"], path

    def revoke_agent_key(self, key_id: str) -> None:
        ok(self.admin.delete(f"{AGENT_PATH}/keys/{key_id}"))

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
        for workload in self.workloads:
            workload.stop()
        super().close()
