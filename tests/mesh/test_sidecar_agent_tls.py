"""The pod agent to mgmt-api over TLS (``grpcs://``), and while mgmt-api is away.

A real mgmt-api serving its gRPC port with a certificate of a test CA; the
cluster's pods reported with the agent's key, the test issuer registered.
Each workload's sidecar agent checks mgmt-api's certificate against the CA
given by file (``--control-plane-ca``) or by value (the injector's
``MESHPLANE_CONTROL_PLANE_CA``); an agent given another CA gets no
certificate, and says so in its metrics.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshplane.sidecar_contract import CONTROL_PLANE_CA_ENV
from tests.mgmt_api.harness import MgmtServer, ok
from tests.support.certs import CertificateAuthority
from tests.support.gateway import BASE, CLUSTER, ORG
from tests.support.mesh import ISSUER_URL, Workload, report_pods
from tests.support.processes import wait_until
from tests.support.workload_tokens import TestIssuer

TD = f"{CLUSTER}.{ORG}.mesh.local"


class TlsPlane:
    """mgmt-api with a TLS gRPC port, one cluster, the test issuer; agents given ``ca``."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.ca = CertificateAuthority(tmp)
        self.other_ca = CertificateAuthority(tmp, name="another CA")
        server = self.ca.issue("mgmt-api")
        env = {
            "MESHPLANE_GRPC_TLS_CERT": str(server.cert),
            "MESHPLANE_GRPC_TLS_KEY": str(server.key),
        }
        (tmp / "mgmt").mkdir()
        self.mgmt = MgmtServer(data_dir=str(tmp / "mgmt"), env=env).start()
        self.admin = self.mgmt.admin()
        self.issuer = TestIssuer(ISSUER_URL)
        self.ca_flag: list[str] = []
        self.env: dict[str, str] | None = None
        ok(self.admin.post("/v2/organizations", json={"name": ORG, "organization": {}}))
        spec = {"workloadIdentity": {"issuers": [self.issuer.registration()]}}
        created = ok(self.admin.post(f"{BASE}/clusters", json={"name": CLUSTER, "cluster": spec}))
        self.credentials = tmp / "credentials.json"
        secret = created["installTemplate"]["helm"]["secrets"]["clusterServiceAccount"]
        self.credentials.write_text(json.dumps(secret))
        self.workloads: list[Workload] = []

    @property
    def control_plane(self) -> str:
        return f"grpcs://127.0.0.1:{self.mgmt.grpc_port}"

    def agent_args(self) -> list[str]:
        return self.ca_flag

    def agent_env(self) -> dict[str, str] | None:
        return self.env

    def workload(self, name: str, namespace: str) -> Workload:
        workload = Workload(self, name, namespace, name)
        self.workloads.append(workload)
        report_pods(self.mgmt, self.credentials, [w.pod for w in self.workloads])
        return workload.start()

    def close(self) -> None:
        for workload in self.workloads:
            workload.stop()
        self.admin.close()
        self.mgmt.close()


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[TlsPlane]:
    setup = TlsPlane(tmp_path)
    try:
        yield setup
    finally:
        setup.close()


def _failures(workload: Workload) -> float:
    found = re.search(r"^meshplane_sidecar_agent_sign_failures_total (\S+)$",
                      workload.agent_metrics(), re.M)  # fmt: skip
    return float(found.group(1)) if found else 0.0


def test_over_tls_with_the_ca_by_file_and_by_value(plane: TlsPlane) -> None:
    plane.ca_flag = ["--control-plane-ca", str(plane.ca.path)]
    by_file = plane.workload("a", "ns1")
    plane.ca_flag, plane.env = [], {**os.environ, CONTROL_PLANE_CA_ENV: plane.ca.path.read_text()}
    by_value = plane.workload("b", "ns2")
    for workload in (by_file, by_value):
        wait_until(workload.certificates, 60, f"{workload.name}'s certificate")
        uris = {san["uri"] for c in workload.certificates() for san in c["subject_alt_names"]}
        assert uris == {f"spiffe://{TD}/ns/{workload.namespace}/sa/{workload.name}"}
    wait_until(lambda: by_file.call(by_value).status_code == 200, 60, "a call over mTLS")
    assert by_file.call(by_value).json()["app"] == "b"


def test_an_agent_that_does_not_trust_mgmt_apis_certificate_gets_nothing(plane: TlsPlane) -> None:
    # The trust domain given: without it the agent would wait for the trust bundle.
    plane.ca_flag = ["--control-plane-ca", str(plane.other_ca.path), "--trust-domain", TD]
    workload = plane.workload("c", "ns1")
    wait_until(lambda: _failures(workload) >= 2, 60, "failed Sign calls")
    assert workload.certificates() == []
