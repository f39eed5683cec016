"""Issue 34's attacker, on the pod side: one ordinary pod against a running mesh.

Real processes: mgmt-api, two workloads (``web`` in ``shop``, ``payments`` in
``billing``) behind their pod agents and Envoys, and an attacker pod
(``shop/attacker``) the cluster's inventory reports, with its own valid token.
The attacker talks to mgmt-api's gRPC port directly, as a raw ADS or Sign
client, with every credential it could hold; each row is refused, and the
real sidecars' traffic is unaffected.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509

from meshplane.control_plane import load_credentials
from meshplane.distribution_contract import TOKEN_AUDIENCE as STREAM_AUDIENCE
from meshplane.proto.workload.v1 import workload_pb2 as pb
from meshplane.proto.workload.v1 import workload_pb2_grpc as pb_grpc
from meshplane.sidecar_contract import SidecarNode, spiffe_id
from meshplane.workload_contract import CA_SECRET
from sidecar_agent import identity
from tests.support.gateway import CLUSTER, ORG
from tests.support.mesh import TRUST_DOMAIN, MeshStack, RawAds
from tests.support.workload_tokens import PodRef, TestIssuer

ATTACKER = PodRef("shop", "attacker-1", "attacker", services=("attacker",))
DELETED = PodRef("shop", "gone-1", "gone", services=("gone",))


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MeshStack]:
    stack = MeshStack(Path(tmp_path_factory.mktemp("attacks")))
    try:
        stack.extra_pods = [ATTACKER]
        stack.workload("web", "shop", "web")
        stack.workload("payments", "billing", "payments")
        stack.sidecars_converged()
        yield stack
    finally:
        stack.close()


@pytest.fixture(scope="module")
def channel(mesh: MeshStack) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{mesh.attach.grpc_port}") as ch:
        yield ch


def node(
    pod: PodRef = ATTACKER,
    *,
    namespace: str | None = None,
    account: str | None = None,
    service: str | None = None,
    inbound: str = "127.0.0.1",
) -> SidecarNode:
    return SidecarNode(
        ORG,
        CLUSTER,
        pod.name,
        namespace or pod.namespace,
        account or pod.service_account,
        service or pod.services[0],
        18080,
        inbound,
        19006,
        19001,
    )


def _agent_token(mesh: MeshStack, audience: str) -> str:
    return load_credentials(mesh.credentials).token(ttl=600, audience=audience)


#: (row, the credential, the node it announces): every one refused on ADS.
ADS_ROWS: list[tuple[str, Callable[[MeshStack], str], SidecarNode]] = [
    (
        "gateway token (repro 1)",
        lambda m: m.gateway_token(),
        node(namespace="shop", account="web", service="web"),
    ),
    ("agent stream token", lambda m: _agent_token(m, STREAM_AUDIENCE), node()),
    (
        "own token, another identity",
        lambda m: m.issuer.token(ATTACKER),
        node(account="web", service="web"),
    ),
    (
        "own token, another namespace's service",
        lambda m: m.issuer.token(ATTACKER),
        node(namespace="billing", account="payments", service="payments"),
    ),
    (
        "own token, another service (repro 2)",
        lambda m: m.issuer.token(ATTACKER),
        node(service="web"),
    ),
    ("own token, another address", lambda m: m.issuer.token(ATTACKER), node(inbound="10.9.9.9")),
    ("expired token", lambda m: m.issuer.token(ATTACKER, now=time.time() - 7200, ttl=3600), node()),
    ("a deleted pod's token", lambda m: m.issuer.token(DELETED), node(DELETED)),
    ("another issuer's token", lambda m: TestIssuer(m.issuer.issuer).token(ATTACKER), node()),
]


@pytest.mark.parametrize(("row", "token", "announced"), ADS_ROWS, ids=[r[0] for r in ADS_ROWS])
def test_the_attackers_sidecar_stream_is_refused(
    mesh: MeshStack,
    channel: grpc.Channel,
    row: str,
    token: Callable[[MeshStack], str],
    announced: SidecarNode,
) -> None:
    ads = RawAds(channel, token(mesh), announced)
    try:
        with pytest.raises(grpc.RpcError) as caught:
            next(ads.responses)
        error: Any = caught.value
        assert error.code() in (
            grpc.StatusCode.PERMISSION_DENIED,
            grpc.StatusCode.UNAUTHENTICATED,
        ), (row, error.code(), error.details())
    finally:
        ads.close()


def test_the_attackers_own_stream_carries_no_key_only_the_trust_bundle(
    mesh: MeshStack, channel: grpc.Channel
) -> None:
    """Admitted as itself, the pod gets configuration and the CA bundle: never a key."""
    ads = RawAds(channel, mesh.issuer.token(ATTACKER), node())
    try:
        first = next(ads.responses)
        assert first.resources
        secrets = ads.secrets()
    finally:
        ads.close()
    names = [s.name for s in secrets]
    assert names == [CA_SECRET], names
    assert not any(s.HasField("tls_certificate") for s in secrets)
    assert "PRIVATE KEY" not in str(secrets)


def _sign(channel: grpc.Channel, token: str, identity_uri: str) -> pb.SignResponse:
    stub = pb_grpc.WorkloadCertificatesStub(channel)  # type: ignore[no-untyped-call]
    request = pb.SignRequest(
        csr_pem=identity.csr_pem(identity.new_key(), identity_uri),
        cluster=f"{ORG}/{CLUSTER}",
        instance=ATTACKER.name,
    )
    answer: pb.SignResponse = stub.Sign(
        request, metadata=(("authorization", f"Bearer {token}"),), timeout=10
    )
    return answer


SIGN_ROWS: list[tuple[str, Callable[[MeshStack], str], str]] = [
    ("own token, web's identity (repro 1)", lambda m: m.issuer.token(ATTACKER), "shop/web"),
    (
        "own token, another namespace's identity",
        lambda m: m.issuer.token(ATTACKER),
        "billing/payments",
    ),
    ("gateway token (repro 1)", lambda m: m.gateway_token(), "shop/web"),
    ("agent stream token (repro 3)", lambda m: _agent_token(m, STREAM_AUDIENCE), "shop/web"),
    (
        "expired token",
        lambda m: m.issuer.token(ATTACKER, now=time.time() - 7200, ttl=3600),
        "shop/attacker",
    ),
    ("a deleted pod's token", lambda m: m.issuer.token(DELETED), "shop/gone"),
]


@pytest.mark.parametrize(("row", "token", "wanted"), SIGN_ROWS, ids=[r[0] for r in SIGN_ROWS])
def test_the_attacker_gets_no_certificate_but_its_own(
    mesh: MeshStack,
    channel: grpc.Channel,
    row: str,
    token: Callable[[MeshStack], str],
    wanted: str,
) -> None:
    namespace, account = wanted.split("/")
    with pytest.raises(grpc.RpcError) as caught:
        _sign(channel, token(mesh), spiffe_id(TRUST_DOMAIN, namespace, account))
    error: Any = caught.value
    assert error.code() in (
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
    ), (row, error.code(), error.details())


def test_the_attackers_own_certificate_is_its_own_identity(
    mesh: MeshStack, channel: grpc.Channel
) -> None:
    own = spiffe_id(TRUST_DOMAIN, "shop", "attacker")
    answer = _sign(channel, mesh.issuer.token(ATTACKER), own)
    cert = x509.load_pem_x509_certificate(answer.certificate_chain_pem.encode())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.UniformResourceIdentifier) == [own]


def test_a_stream_announcing_another_service_takes_none_of_its_traffic(
    mesh: MeshStack, channel: grpc.Channel
) -> None:
    """Reproduction 2: an attacker announcing ``payments``/``web`` at its own address
    (with every credential it has) while calls go on: every call reaches the real app."""
    web, payments = mesh.workloads
    attempts = [
        RawAds(channel, mesh.issuer.token(ATTACKER), node(service="web")),
        RawAds(
            channel,
            mesh.gateway_token(),
            node(namespace="billing", account="payments", service="payments"),
        ),
    ]
    try:
        answers = [web.call(payments).json()["app"] for _ in range(8)]
        answers += [payments.call(web).json()["app"] for _ in range(8)]
    finally:
        for ads in attempts:
            ads.close()
    assert answers == ["payments"] * 8 + ["web"] * 8
    status = mesh.status()
    instances = {i["instance"] for i in status["instances"] if i["connected"]}
    assert ATTACKER.name not in instances


def test_the_sidecar_has_no_admin_port_and_no_token_in_its_configuration(
    mesh: MeshStack,
) -> None:
    """Reproduction 1's first step: nothing in the pod reads a credential from Envoy."""
    web = mesh.workloads[0]
    dump = web.admin("GET", "/config_dump", params={"include_eds": "true"}).text
    assert web.token_file.read_text().strip() not in dump
    assert "Bearer" not in dump and "PRIVATE KEY" not in dump
    boot = web.admin("GET", "/config_dump").json()["configs"][0]["bootstrap"]
    assert set(boot["admin"]["address"]) == {"pipe"}
