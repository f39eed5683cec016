"""WorkloadCertificates/Sign and sidecar ADS admission against a running mgmt-api, over sockets.

A real ``mgmt-api serve`` process (SQLite) with its gRPC port; clusters are
created over REST and their agent reports pods and the service-account
issuer over ``PUT .../inventory``. Workload tokens are minted with a test
issuer key (:class:`tests.support.workload_tokens.TestIssuer`: no Kubernetes
API server runs here), in the projected token's claim shape.
"""

from __future__ import annotations

import json
import queue
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import json_format, struct_pb2

from meshplane.control_plane import ServiceAccountKey
from meshplane.distribution_contract import TOKEN_AUDIENCE as DISTRIBUTION_AUDIENCE
from meshplane.gateway_contract import XDS_AUDIENCE
from meshplane.proto.workload.v1 import workload_pb2 as pb
from meshplane.proto.workload.v1 import workload_pb2_grpc as pb_grpc
from meshplane.sidecar_contract import SidecarNode, spiffe_id
from mgmt_api.compiler import gateway_xds
from tests.mgmt_api.agents import agent, create_cluster
from tests.mgmt_api.harness import MgmtServer, ok, unique
from tests.support.workload_tokens import PodRef, TestIssuer

WEB = PodRef("shop", "web-1", "web", ip="127.0.0.1", services=("web",))
PAYMENTS = PodRef("billing", "payments-1", "payments", ip="127.0.0.1", services=("payments",))
POD_IP = PodRef("shop", "web-2", "web", ip="10.1.2.3", services=("web",))
ISSUER = TestIssuer("https://kubernetes.default.svc")
# Another cluster: the same default issuer URL, its own key.
OTHER_ISSUER = TestIssuer("https://kubernetes.default.svc")


class Cluster:
    """A cluster created over REST, its agent, and the pods it reports."""

    def __init__(self, server: MgmtServer, admin: httpx.Client, org: str, name: str) -> None:
        self.server, self.org, self.name = server, org, name
        self.created = create_cluster(admin, org, name)
        self.fqn = self.created["fqn"]
        self.node_cluster = f"{org}/{name}"
        self.trust_domain = f"{name}.{org}.mesh.local"

    def report(self, issuer: TestIssuer, *pods: PodRef) -> None:
        namespaces: dict[str, list[dict[str, Any]]] = {}
        for pod in pods:
            namespaces.setdefault(pod.namespace, []).append(pod.report())
        body = {
            "namespaces": [{"name": ns, "pods": items} for ns, items in sorted(namespaces.items())],
            "state": {"provider": "kubernetes", "serviceAccountIssuer": issuer.registration()},
        }
        with agent(self.server, self.created) as client:
            ok(client.put(f"/v2/{self.fqn}/inventory", json=body))

    def agent_token(self, audience: str) -> str:
        secret = self.created["installTemplate"]["helm"]["secrets"]["clusterServiceAccount"]
        key = ServiceAccountKey(json.loads(secret["jwk"]), secret["serviceAccountFqn"], self.fqn)
        return key.token(ttl=600, audience=audience)


@pytest.fixture(scope="module")
def server() -> Iterator[MgmtServer]:
    srv = MgmtServer(None).start()
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def admin(server: MgmtServer) -> Iterator[httpx.Client]:
    with server.admin() as client:
        yield client


@pytest.fixture(scope="module")
def org(admin: httpx.Client) -> str:
    name = unique("org")
    ok(admin.post("/v2/organizations", json={"name": name, "organization": {}}))
    return name


@pytest.fixture(scope="module")
def c1(server: MgmtServer, admin: httpx.Client, org: str) -> Cluster:
    cluster = Cluster(server, admin, org, "c1")
    cluster.report(ISSUER, WEB, PAYMENTS, POD_IP)
    return cluster


@pytest.fixture(scope="module")
def c2(server: MgmtServer, admin: httpx.Client, org: str) -> Cluster:
    cluster = Cluster(server, admin, org, "c2")
    cluster.report(OTHER_ISSUER, WEB)
    return cluster


@pytest.fixture(scope="module")
def channel(server: MgmtServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch:
        yield ch


def _csr(*uris: str, key: ec.EllipticCurvePrivateKey | None = None) -> str:
    key = key or ec.generate_private_key(ec.SECP256R1())
    names = [x509.UniformResourceIdentifier(u) for u in uris]
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([]))
        .add_extension(x509.SubjectAlternativeName(names), critical=True)
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM).decode()


def _sign(channel: grpc.Channel, cluster: Cluster, token: str | None, csr: str) -> pb.SignResponse:
    stub = pb_grpc.WorkloadCertificatesStub(channel)  # type: ignore[no-untyped-call]
    metadata = () if token is None else (("authorization", f"Bearer {token}"),)
    request = pb.SignRequest(csr_pem=csr, cluster=cluster.node_cluster, instance="web-1.shop")
    response: pb.SignResponse = stub.Sign(request, metadata=metadata, timeout=10)
    return response


def _refused(call: Callable[[], object], code: grpc.StatusCode) -> str:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    error: Any = caught.value
    assert error.code() == code, error.details()
    return str(error.details())


def _own(cluster: Cluster, pod: PodRef = WEB) -> str:
    return spiffe_id(cluster.trust_domain, pod.namespace, pod.service_account)


def test_sign_issues_the_verified_identity_only(
    channel: grpc.Channel, admin: httpx.Client, c1: Cluster
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    answer = _sign(channel, c1, ISSUER.token(WEB), _csr(_own(c1), key=key))
    cert = x509.load_pem_x509_certificate(answer.certificate_chain_pem.encode())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [_own(c1)]
    assert cert.public_key() == key.public_key()  # our key: mgmt-api never made one
    ca = x509.load_pem_x509_certificate(answer.trust_bundle_pem[0].encode())
    cert.verify_directly_issued_by(ca)
    assert answer.not_after_unix == int(cert.not_valid_after_utc.timestamp())
    assert answer.not_after_unix > time.time() + 3600
    # Recorded for the CA rotation: the pod holds a certificate of the signing CA.
    progress = ok(admin.get(f"/v2/{c1.fqn}/status"))["meshCa"]["progress"]
    assert progress["sidecars"] >= 1 and progress["onNewCa"] >= 1, progress


@pytest.mark.parametrize(
    ("case", "token", "csr", "code"),
    [
        (
            "another pod's identity",
            lambda c: ISSUER.token(WEB),
            lambda c: _csr(_own(c, PAYMENTS)),
            grpc.StatusCode.PERMISSION_DENIED,
        ),
        (
            "two SANs",
            lambda c: ISSUER.token(WEB),
            lambda c: _csr(_own(c), _own(c, PAYMENTS)),
            grpc.StatusCode.PERMISSION_DENIED,
        ),
        (
            "the agent key's stream token",
            lambda c: c.agent_token(DISTRIBUTION_AUDIENCE),
            lambda c: _csr(_own(c)),
            grpc.StatusCode.PERMISSION_DENIED,
        ),
        (
            "a gateway-xds token",
            lambda c: c.agent_token(XDS_AUDIENCE),
            lambda c: _csr(_own(c)),
            grpc.StatusCode.PERMISSION_DENIED,
        ),
        (
            "an expired token",
            lambda c: ISSUER.token(WEB, now=time.time() - 7200, ttl=3600),
            lambda c: _csr(_own(c)),
            grpc.StatusCode.PERMISSION_DENIED,
        ),
        (
            "another cluster's issuer",
            lambda c: OTHER_ISSUER.token(WEB),
            lambda c: _csr(_own(c)),
            grpc.StatusCode.PERMISSION_DENIED,
        ),
        (
            "a token for another audience",
            lambda c: ISSUER.token(WEB, audience="https://kubernetes.default.svc"),
            lambda c: _csr(_own(c)),
            grpc.StatusCode.PERMISSION_DENIED,
        ),
        ("no token", lambda c: None, lambda c: _csr(_own(c)), grpc.StatusCode.UNAUTHENTICATED),
        (
            "not a CSR",
            lambda c: ISSUER.token(WEB),
            lambda c: "-----BEGIN CERTIFICATE REQUEST-----\n-----END CERTIFICATE REQUEST-----",
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
    ],
)
def test_sign_refuses(
    channel: grpc.Channel,
    c1: Cluster,
    c2: Cluster,
    case: str,
    token: Callable[[Cluster], str | None],
    csr: Callable[[Cluster], str],
    code: grpc.StatusCode,
) -> None:
    _refused(lambda: _sign(channel, c1, token(c1), csr(c1)), code)


def test_sign_refuses_a_key_it_signed_before(channel: grpc.Channel, c1: Cluster) -> None:
    csr = _csr(_own(c1))
    _sign(channel, c1, ISSUER.token(WEB), csr)
    details = _refused(
        lambda: _sign(channel, c1, ISSUER.token(WEB), csr), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert "signed before" in details


def test_sign_refuses_a_deleted_pod_from_the_next_report(
    server: MgmtServer, admin: httpx.Client, channel: grpc.Channel, org: str
) -> None:
    cluster = Cluster(server, admin, org, unique("del"))
    pod = PodRef("shop", "short-lived", "web", services=("web",))
    cluster.report(ISSUER, pod)
    _sign(channel, cluster, ISSUER.token(pod), _csr(_own(cluster, pod)))
    cluster.report(ISSUER)  # the pod was deleted
    details = _refused(
        lambda: _sign(channel, cluster, ISSUER.token(pod), _csr(_own(cluster, pod))),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    assert "not in the cluster's inventory" in details


def test_an_admin_registered_issuer_verifies_and_its_counts_show(
    server: MgmtServer, admin: httpx.Client, channel: grpc.Channel, org: str
) -> None:
    """Outside Kubernetes: the admin registers the issuer that mints the workloads' tokens."""
    cluster = Cluster(server, admin, org, unique("vm"))
    vm_issuer = TestIssuer("https://vm-issuer.example", rsa_key=True)
    pod = PodRef("vms", "vm-1", "billing", services=("billing",))
    cluster.report(ISSUER, pod)
    _refused(
        lambda: _sign(channel, cluster, vm_issuer.token(pod), _csr(_own(cluster, pod))),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    body = ok(admin.get(f"/v2/{cluster.fqn}"))
    body["workloadIdentity"] = {"issuers": [vm_issuer.registration()]}
    ok(admin.put(f"/v2/{cluster.fqn}", json=body))
    _sign(channel, cluster, vm_issuer.token(pod), _csr(_own(cluster, pod)))
    metrics = ok_text(admin.get("/metrics"))
    assert 'mgmt_api_workload_certificates_total{outcome="issued",reason=""}' in metrics
    assert 'mgmt_api_workload_certificates_total{outcome="refused",reason="issuer"}' in metrics


def ok_text(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.text


# ---- sidecar ADS admission ------------------------------------------------------------


class Ads:
    """A raw ADS client (what a pod-local agent relays), on its own thread-fed stream."""

    def __init__(self, channel: grpc.Channel, token: str | None, node: SidecarNode) -> None:
        self._requests: queue.Queue[discovery_pb2.DiscoveryRequest | None] = queue.Queue()
        metadata = struct_pb2.Struct()
        json_format.ParseDict(node.metadata(), metadata)
        envoy_node = base_pb2.Node(id=node.instance, cluster=node.node_cluster, metadata=metadata)
        self._requests.put(
            discovery_pb2.DiscoveryRequest(node=envoy_node, type_url=gateway_xds.CLUSTER_TYPE)
        )
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
        headers = () if token is None else (("authorization", f"Bearer {token}"),)
        self.responses = stub.StreamAggregatedResources(
            iter(self._requests.get, None), metadata=headers, timeout=60
        )

    def close(self) -> None:
        self._requests.put(None)
        self.responses.cancel()


def _node(cluster: Cluster, pod: PodRef = WEB, **kw: Any) -> SidecarNode:
    base: dict[str, Any] = {
        "namespace": pod.namespace,
        "service_account": pod.service_account,
        "service": pod.services[0],
        "app_port": 8080,
        "inbound_host": pod.ip,
    }
    return SidecarNode(cluster.org, cluster.name, f"{pod.name}.{pod.namespace}", **{**base, **kw})


def test_a_sidecar_with_its_own_token_gets_its_configuration_and_the_expiry_gauge_its_pods(
    channel: grpc.Channel, admin: httpx.Client, c1: Cluster
) -> None:
    node = _node(c1)
    ads = Ads(channel, ISSUER.token(WEB), node)
    try:
        first = next(ads.responses)
        assert first.type_url == gateway_xds.CLUSTER_TYPE and first.resources
        # The gauge shows what Sign issued for the stream's verified pod, whoever asks.
        _sign(channel, c1, ISSUER.token(PAYMENTS), _csr(_own(c1, PAYMENTS)))
        not_after = _sign(channel, c1, ISSUER.token(WEB), _csr(_own(c1))).not_after_unix
        series = (
            "meshplane_sidecar_certificate_expiry_timestamp_seconds"
            f'{{cluster="{c1.node_cluster}",instance="{node.instance}"}} '
        )
        lines = [line for line in ok_text(admin.get("/metrics")).splitlines() if series in line]
        assert [float(line.rsplit(" ", 1)[1]) for line in lines] == [not_after]
    finally:
        ads.close()


@pytest.mark.parametrize(
    ("case", "token", "node", "code", "audited"),
    [
        (
            "another identity announced",
            lambda c: ISSUER.token(WEB),
            lambda c: _node(c, namespace="billing", service_account="payments", service="payments"),
            grpc.StatusCode.PERMISSION_DENIED,
            True,
        ),
        (
            "a service the pod is not in",
            lambda c: ISSUER.token(WEB),
            lambda c: _node(c, service="payments"),
            grpc.StatusCode.PERMISSION_DENIED,
            True,
        ),
        (
            "an address not the pod's",
            lambda c: ISSUER.token(POD_IP),
            lambda c: _node(c, POD_IP, inbound_host="10.9.9.9"),
            grpc.StatusCode.PERMISSION_DENIED,
            True,
        ),
        (
            "the agent key's gateway token",
            lambda c: c.agent_token(XDS_AUDIENCE),
            _node,
            grpc.StatusCode.PERMISSION_DENIED,
            False,
        ),
        (
            "another cluster's issuer",
            lambda c: OTHER_ISSUER.token(WEB),
            _node,
            grpc.StatusCode.PERMISSION_DENIED,
            False,
        ),
        ("no token", lambda c: None, _node, grpc.StatusCode.UNAUTHENTICATED, False),
    ],
)
def test_sidecar_admission_refuses(
    channel: grpc.Channel,
    admin: httpx.Client,
    c1: Cluster,
    c2: Cluster,
    case: str,
    token: Callable[[Cluster], str | None],
    node: Callable[[Cluster], SidecarNode],
    code: grpc.StatusCode,
    audited: bool,
) -> None:
    ads = Ads(channel, token(c1), node(c1))
    try:
        details = _refused(lambda: next(ads.responses), code)
    finally:
        ads.close()
    if audited:
        logs = ok(
            admin.get(
                f"/v2/organizations/{c1.org}/auditlogs",
                params={"operation": "REFUSE_SIDECAR", "fqnPrefix": c1.fqn},
            )
        )
        assert any(details in entry["message"] for entry in logs["auditLogs"]), logs


def test_a_deleted_pods_stream_is_closed(
    server: MgmtServer, admin: httpx.Client, channel: grpc.Channel, org: str
) -> None:
    cluster = Cluster(server, admin, org, unique("gone"))
    pod = PodRef("shop", "doomed", "web", services=("web",))
    cluster.report(ISSUER, pod)
    ads = Ads(channel, ISSUER.token(pod), _node(cluster, pod))
    try:
        next(ads.responses)
        cluster.report(ISSUER)  # the pod was deleted
        started = time.monotonic()
        details = _refused(lambda: list(ads.responses), grpc.StatusCode.PERMISSION_DENIED)
        assert "not in the cluster's inventory" in details
        assert time.monotonic() - started < 30
    finally:
        ads.close()


def test_a_change_of_the_reported_issuer_is_audited_naming_its_key_ids(
    server: MgmtServer, admin: httpx.Client, org: str
) -> None:
    """What attestation trusts changes only with an audit record: the first report,
    and every report whose issuer differs (a rotation, or whoever holds the agent key)."""
    cluster = Cluster(server, admin, org, unique("iss"))
    rotated = TestIssuer(ISSUER.issuer)

    def changes() -> list[dict[str, Any]]:
        logs = ok(
            admin.get(
                f"/v2/organizations/{org}/auditlogs",
                params={"operation": "CHANGE_WORKLOAD_ISSUER", "fqnPrefix": cluster.fqn},
            )
        )
        entries: list[dict[str, Any]] = logs["auditLogs"]
        return entries

    cluster.report(ISSUER, WEB)
    cluster.report(ISSUER, WEB, PAYMENTS)  # same issuer: pods change, no issuer record
    assert len(changes()) == 1
    cluster.report(rotated, WEB)
    newest = changes()
    assert len(newest) == 2
    assert rotated.kid in newest[0]["message"] and "-----" not in json.dumps(newest)
