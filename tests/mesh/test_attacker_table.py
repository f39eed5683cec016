"""The attacker table: every credential a pod could hold or steal, against everything it might ask.

One running ``mgmt-api serve`` (SQLite) with its REST and gRPC sockets; two
clusters created over REST, whose agents report pods and their
service-account issuers. Each credential is used the way an attacker holding
it would: a cluster key mints a token with whatever audience the thing it
asks for wants; a pod's token is presented as it is.

Only four cells of the table are admitted: a pod's own token gets its own
certificate and registers as its own service; the gateway's credential gets
the gateway's config; extauthz's gets extauthz's policies. Every other cell
is refused. (The sidecar's Envoy admin API is on a Unix socket in the pod:
``tests/mesh/test_mesh.py`` checks that nothing listens for it on TCP.)
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import grpc
import httpx
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import json_format, struct_pb2

from meshplane import gateway_contract as gc
from meshplane.control_plane import ServiceAccountKey
from meshplane.distribution_contract import TOKEN_AUDIENCE as POLICY_AUDIENCE
from meshplane.proto.distribution.v1 import distribution_pb2 as dpb
from meshplane.proto.distribution.v1 import distribution_pb2_grpc as dpb_grpc
from meshplane.proto.workload.v1 import workload_pb2 as pb
from meshplane.proto.workload.v1 import workload_pb2_grpc as pb_grpc
from meshplane.sidecar_contract import SidecarNode, spiffe_id
from mgmt_api.auth.tokens import sign_service_account
from mgmt_api.compiler import gateway_xds
from tests.mgmt_api.agents import agent, create_cluster
from tests.mgmt_api.harness import MgmtServer, ok, unique
from tests.support.cluster_credentials import credential, private_jwk
from tests.support.stream_probe import first_answer
from tests.support.workload_tokens import PodRef, TestIssuer, csr_pem

WEB = PodRef("shop", "web-1", "web", services=("web",))
PAYMENTS = PodRef("billing", "payments-1", "payments", services=("payments",))
GONE = PodRef("shop", "web-gone", "web", services=("web",))
ISSUER = TestIssuer("https://kubernetes.default.svc")
OTHER_ISSUER = TestIssuer("https://kubernetes.default.svc")  # another cluster's: same URL


@dataclass
class Mesh:
    """The running mgmt-api, its cluster under attack and that cluster's install answer."""

    server: MgmtServer
    org: str
    cluster: str
    created: dict[str, object]

    @property
    def node_cluster(self) -> str:
        return f"{self.org}/{self.cluster}"

    def spiffe(self, pod: PodRef) -> str:
        return spiffe_id(
            f"{self.cluster}.{self.org}.mesh.local", pod.namespace, pod.service_account
        )

    def key(self, component: str) -> ServiceAccountKey:
        entry = credential(self.created, component)
        return ServiceAccountKey(
            json.loads(entry["jwk"]), entry["serviceAccountFqn"], entry["clusterFqn"]
        )


def _report(
    server: MgmtServer, org: str, created: dict[str, object], issuer: TestIssuer, *pods: PodRef
) -> None:
    namespaces: dict[str, list[dict[str, object]]] = {}
    for pod in pods:
        namespaces.setdefault(pod.namespace, []).append(pod.report())
    body = {
        "namespaces": [{"name": ns, "pods": items} for ns, items in sorted(namespaces.items())],
        "state": {"provider": "kubernetes", "serviceAccountIssuer": issuer.registration()},
    }
    with agent(server, created) as client:
        ok(client.put(f"/v2/{created['fqn']}/inventory", json=body))


@pytest.fixture(scope="module")
def mesh() -> Iterator[Mesh]:
    server = MgmtServer(None).start()
    try:
        with server.admin() as admin:
            org = unique("attack")
            ok(admin.post("/v2/organizations", json={"name": org, "organization": {}}))
            created = create_cluster(admin, org, "c1")
            other = create_cluster(admin, org, "c2")
        # GONE was a pod of c1 (its token still verifies), then the agent reported it deleted.
        _report(server, org, created, ISSUER, WEB, PAYMENTS, GONE)
        gone_token = ISSUER.token(GONE)
        _report(server, org, created, ISSUER, WEB, PAYMENTS)
        _report(server, org, other, OTHER_ISSUER, WEB)
        mesh = Mesh(server, org, "c1", created)
        CREDENTIALS["token of a deleted pod"] = lambda m, aud: gone_token
        yield mesh
    finally:
        server.close()


# ---- the credentials: (mesh, audience the ask wants) -> bearer ------------------------

Credential = Callable[[Mesh, str], str]


def _cluster_key(component: str) -> Credential:
    """A token of the component's key for the ask's audience ("" for REST: no audience)."""

    def bearer(m: Mesh, audience: str) -> str:
        key = m.key(component)
        if not audience:
            return sign_service_account(private_jwk(key), key.subject or "", time.time(), 300)
        return key.token(ttl=300, audience=audience)

    return bearer


CREDENTIALS: dict[str, Credential] = {
    "own pod token": lambda m, aud: ISSUER.token(WEB),
    "expired pod token": lambda m, aud: ISSUER.token(WEB, now=time.time() - 7200),
    "token of a deleted pod": lambda m, aud: "",  # set by the fixture (minted before deletion)
    "token of another cluster's issuer": lambda m, aud: OTHER_ISSUER.token(WEB),
    "agent key": _cluster_key("agent"),
    "gateway credential": _cluster_key("gateway"),
    "extauthz credential": _cluster_key("extauthz"),
    "ratelimit credential": _cluster_key("ratelimit"),
}


# ---- the asks: (mesh, bearer factory) -> admitted? -------------------------------------


def _grpc(m: Mesh) -> grpc.Channel:
    return grpc.insecure_channel(f"127.0.0.1:{m.server.grpc_port}")


def _sign(pod: PodRef) -> Callable[[Mesh, Credential], bool]:
    def ask(m: Mesh, cred: Credential) -> bool:
        token = cred(m, "meshplane")
        request = pb.SignRequest(csr_pem=csr_pem(m.spiffe(pod)), cluster=m.node_cluster)
        with _grpc(m) as channel:
            stub = pb_grpc.WorkloadCertificatesStub(channel)  # type: ignore[no-untyped-call]
            try:
                stub.Sign(request, metadata=(("authorization", f"Bearer {token}"),), timeout=10)
            except grpc.RpcError as exc:
                assert exc.code() in _REFUSED, exc
                return False
        return True

    return ask


_REFUSED = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)


def _ads(m: Mesh, token: str, metadata: Mapping[str, object]) -> bool:
    meta = struct_pb2.Struct()
    json_format.ParseDict(dict(metadata), meta)
    node = base_pb2.Node(id="probe", cluster=m.node_cluster, metadata=meta)
    first = discovery_pb2.DiscoveryRequest(node=node, type_url=gateway_xds.CLUSTER_TYPE)
    with _grpc(m) as channel:
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
        code = first_answer(
            lambda held: stub.StreamAggregatedResources(
                iter(held), metadata=[("authorization", f"Bearer {token}")], timeout=20
            ),
            first,
        )
    assert code is None or code in _REFUSED, code
    return code is None


def _sidecar(pod: PodRef) -> Callable[[Mesh, Credential], bool]:
    """Register as ``pod``'s service at its address (what WEB's own sidecar announces for WEB)."""

    def ask(m: Mesh, cred: Credential) -> bool:
        node = SidecarNode(
            m.org,
            m.cluster,
            "probe",
            pod.namespace,
            pod.service_account,
            pod.services[0],
            8080,
            inbound_host=pod.ip,
        )
        return _ads(m, cred(m, gc.XDS_AUDIENCE), node.metadata())

    return ask


def _gateway_config(m: Mesh, cred: Credential) -> bool:
    listener = {gc.LISTENER_KEY: {"address": "127.0.0.1", "port": 10000}}
    return _ads(m, cred(m, gc.XDS_AUDIENCE), listener)


def _policies_with_secrets(m: Mesh, cred: Credential) -> bool:
    node = dpb.Node(kind="extauthz", organization=m.org, cluster=m.cluster, instance="probe")
    token = cred(m, POLICY_AUDIENCE)
    with _grpc(m) as channel:
        stub = dpb_grpc.PolicyDistributionStub(channel)  # type: ignore[no-untyped-call]
        code = first_answer(
            lambda held: stub.StreamSnapshots(
                iter(held), metadata=[("authorization", f"Bearer {token}")], timeout=20
            ),
            dpb.SnapshotRequest(node=node),
        )
    assert code is None or code in _REFUSED, code
    return code is None


def _rest_write(m: Mesh, cred: Credential) -> bool:
    """PUT the cluster's tokenTtl to 720 h (reproduction 3), with a REST token of the credential."""
    token = cred(m, "")
    path = f"/v2/organizations/{m.org}/clusters/{m.cluster}"
    with m.server.client(headers={"Authorization": f"Bearer {token}"}) as client:
        current = client.get(path)
        if current.status_code != 200:
            assert current.status_code in (401, 403), current.text
            return False
        body = {**current.json(), "tokenTtl": "2592000s"}
        answer = client.put(path, json=body)
    assert answer.status_code in (200, 401, 403), answer.text
    return answer.status_code == 200


ASKS: dict[str, Callable[[Mesh, Credential], bool]] = {
    "certificate for its own identity": _sign(WEB),
    "certificate for another identity": _sign(PAYMENTS),
    "endpoint of its own service": _sidecar(WEB),
    "endpoint of another service": _sidecar(PAYMENTS),
    "a gateway's config": _gateway_config,
    "policies with secrets (extauthz's)": _policies_with_secrets,
    "REST write on the cluster": _rest_write,
}

ADMITTED = {
    ("own pod token", "certificate for its own identity"),
    ("own pod token", "endpoint of its own service"),
    ("gateway credential", "a gateway's config"),
    ("extauthz credential", "policies with secrets (extauthz's)"),
}


@pytest.mark.parametrize("ask", list(ASKS))
@pytest.mark.parametrize("credential_name", list(CREDENTIALS))
def test_attacker_table(mesh: Mesh, credential_name: str, ask: str) -> None:
    admitted = ASKS[ask](mesh, CREDENTIALS[credential_name])
    assert admitted == ((credential_name, ask) in ADMITTED), (credential_name, ask, admitted)


def test_a_rest_token_of_a_cluster_key_authenticates_but_holds_no_role(mesh: Mesh) -> None:
    """The REST row above is refused for the right reason: 403 (no role), not a broken token."""
    token = _cluster_key("agent")(mesh, "")
    path = f"/v2/organizations/{mesh.org}/clusters/{mesh.cluster}"
    with mesh.server.client(headers={"Authorization": f"Bearer {token}"}) as client:
        assert client.get(path).status_code == 403
    with httpx.Client() as plain:
        assert plain.get(f"{mesh.server.url}{path}").status_code == 401
