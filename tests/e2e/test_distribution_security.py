"""The policy stream between real processes over TLS, and revoking it.

``mgmt-api`` serves PolicyDistribution with a certificate from a CA made in
the test (``MESHPLANE_GRPC_TLS_CERT``/``_KEY``); a real ``ratelimit serve
--control-plane grpcs://... --control-plane-ca`` subscribes, applies the
cluster's policy and exports the applied version on ``/metrics``. Deleting
the service-account key it subscribed with ends its open stream (it does
not wait for the next reconnect), and the instance keeps enforcing its last
good snapshot.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from meshplane.proto.distribution.v1 import distribution_pb2 as dpb
from meshplane.proto.distribution.v1 import distribution_pb2_grpc as dpb_grpc
from tests.mgmt_api.harness import MgmtServer, ok
from tests.support.certs import CertificateAuthority
from tests.support.cluster_credentials import credential, write_credential
from tests.support.net import free_port
from tests.support.processes import Service, wait_until

ORG = "sec"
CLUSTER_PATH = f"/v2/organizations/{ORG}/clusters/c1"


class Setup:
    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tmp = tmp
        self.ca = CertificateAuthority(tmp)
        server = self.ca.issue("mgmt-api")
        monkeypatch.setenv("MESHPLANE_GRPC_TLS_CERT", str(server.cert))
        monkeypatch.setenv("MESHPLANE_GRPC_TLS_KEY", str(server.key))
        (tmp / "mgmt").mkdir()
        self.mgmt = MgmtServer(data_dir=str(tmp / "mgmt")).start()
        self.admin = self.mgmt.admin()
        self.service: Service | None = None
        self.log = tmp / "ratelimit.log"

    def start_ratelimit(self, credentials: Path) -> tuple[int, int]:
        port, metrics = free_port(), free_port()
        args = ["serve", "--listen", f"127.0.0.1:{port}", "--metrics-listen"]
        args += [f"127.0.0.1:{metrics}", "--control-plane"]
        args += [
            f"grpcs://127.0.0.1:{self.mgmt.grpc_port}",
            "--control-plane-ca",
            str(self.ca.path),
        ]
        args += ["--cluster", f"{ORG}/c1", "--credentials", str(credentials)]
        args += ["--cache-dir", str(self.tmp / "cache")]
        self.service = Service(["ratelimit.cli", *args], port, self.log).start()
        return port, metrics

    def instances(self) -> list[dict[str, Any]]:
        return ok(self.admin.get(f"{CLUSTER_PATH}/status"))["instances"]  # type: ignore[no-any-return]

    def close(self) -> None:
        if self.service is not None:
            self.service.stop()
        self.admin.close()
        self.mgmt.close()


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Setup]:
    s = Setup(tmp_path, monkeypatch)
    try:
        yield s
    finally:
        s.close()


def test_a_service_subscribes_over_tls_and_a_revoked_key_ends_its_stream(setup: Setup) -> None:
    ok(setup.admin.post("/v2/organizations", json={"name": ORG, "organization": {}}))
    created = ok(
        setup.admin.post(f"/v2/organizations/{ORG}/clusters", json={"name": "c1", "cluster": {}})
    )
    secret = credential(created, "ratelimit")
    credentials = write_credential(created, "ratelimit", setup.tmp / "credentials.json")
    policy = {
        "spec": {
            "targetRef": {"kind": "HTTPRoute", "name": "web"},
            "rateLimit": {
                "type": "Global",
                "global": {"rules": [{"limit": {"requests": 3, "unit": "Minute"}}]},
            },
        }
    }
    ok(
        setup.admin.post(
            f"{CLUSTER_PATH}/backendtrafficpolicies",
            json={"name": "default.web", "backendTrafficPolicy": policy},
        )
    )
    _, metrics_port = setup.start_ratelimit(credentials)
    desired = ok(setup.admin.get(f"{CLUSTER_PATH}/status"))["desiredVersions"]["ratelimit"]

    def acked() -> bool:
        return any(
            i["appliedVersion"] == desired and i["lastResult"] == "ACK" and i["connected"]
            for i in setup.instances()
        )

    wait_until(acked, what="the TLS subscriber to ACK the desired version")

    # The applied version on the service's own /metrics (one series).
    def exported() -> str | None:
        text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
        line = f'meshplane_distribution_applied_info{{kind="ratelimit",version="{desired}"}} 1.0'
        return text if line in text and "meshplane_distribution_connected 1.0" in text else None

    text = wait_until(exported, what="the applied version on /metrics")
    assert text.count("meshplane_distribution_applied_info{") == 1

    # A plaintext client cannot even reach the stream.
    with grpc.insecure_channel(f"127.0.0.1:{setup.mgmt.grpc_port}") as channel:
        stub = dpb_grpc.PolicyDistributionStub(channel)  # type: ignore[no-untyped-call]
        node = dpb.Node(kind="ratelimit", organization=ORG, cluster="c1", instance="probe")
        with pytest.raises(grpc.RpcError) as info:
            next(stub.StreamSnapshots(iter([dpb.SnapshotRequest(node=node)]), timeout=5))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE

    # Revoke the key the service subscribed with: its open stream ends.
    account = f"{CLUSTER_PATH}/serviceaccounts/ratelimit"
    ok(setup.admin.delete(f"{account}/keys/{secret['keyId']}"))
    wait_until(
        lambda: not any(i["connected"] for i in setup.instances()),
        what="the revoked stream to close",
    )
    assert "PERMISSION_DENIED" in wait_until(
        lambda: "PERMISSION_DENIED" in setup.log.read_text() and setup.log.read_text(),
        what="the service to log the refusal",
    )
    assert setup.service is not None and setup.service.proc is not None
    assert setup.service.proc.poll() is None  # still serving its cache
    assert (setup.tmp / "cache" / "current" / ".version").read_text().strip() == desired
