"""The ADS server's protocol and admission, through a real gRPC socket to mgmt-api.

A Python client speaks Envoy's ``StreamAggregatedResources`` with the
official protos (xds-protos), to reach the cases a well-behaved Envoy never
produces: stale nonces, unknown types, wrong credentials, a malformed node.
What a real Envoy does with the resources is tested in the other modules of
this package.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import struct_pb2
from google.rpc import status_pb2

from meshplane import gateway_contract as gc
from meshplane.control_plane import load_credentials
from mgmt_api.auth.tokens import sign_service_account
from mgmt_api.compiler import gateway_xds
from tests.mgmt_api.harness import MgmtServer, ok
from tests.support.cluster_credentials import private_jwk, write_credential
from tests.support.processes import wait_until

ORG = "ads"
CLUSTER = "c1"
OTHER = "c2"
CLUSTER_PATH = f"/v2/organizations/{ORG}/clusters/{CLUSTER}"
TYPES = (gateway_xds.CLUSTER_TYPE, gateway_xds.LISTENER_TYPE, gateway_xds.ROUTE_TYPE)


class Setup:
    def __init__(self, tmp: Path) -> None:
        (tmp / "mgmt").mkdir()
        self.tmp = tmp
        self.mgmt = MgmtServer(data_dir=str(tmp / "mgmt")).start()
        self.admin = self.mgmt.admin()
        ok(self.admin.post("/v2/organizations", json={"name": ORG, "organization": {}}))
        self.agent_keys: dict[str, Path] = {}
        self.keys = {name: self._cluster(name) for name in (CLUSTER, OTHER)}

    def _cluster(self, name: str) -> Path:
        created = ok(
            self.admin.post(f"/v2/organizations/{ORG}/clusters", json={"name": name, "cluster": {}})
        )
        self.agent_keys[name] = write_credential(created, "agent", self.tmp / f"{name}-agent.json")
        return write_credential(created, "gateway", self.tmp / f"{name}.json")

    def token(self, cluster: str = CLUSTER, audience: str = gc.XDS_AUDIENCE, ttl: int = 600) -> str:
        return load_credentials(self.keys[cluster]).token(ttl=ttl, audience=audience)

    def rest_token(self) -> str:
        """A service-account token as REST takes it (no stream audience)."""
        key = load_credentials(self.keys[CLUSTER])
        return sign_service_account(private_jwk(key), key.subject or "", time.time(), 600)

    def close(self) -> None:
        self.admin.close()
        self.mgmt.close()


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    st = Setup(Path(tmp_path_factory.mktemp("ads")))
    try:
        yield st
    finally:
        st.close()


def node(
    instance: str = "py-1",
    cluster: str = f"{ORG}/{CLUSTER}",
    metadata: Mapping[str, Any] | None = None,
) -> base_pb2.Node:
    """The gateway's node; ``metadata`` entries replace or add to the listener's."""
    meta = struct_pb2.Struct()
    meta.update({gc.LISTENER_KEY: {"address": "127.0.0.1", "port": 10000}, **(metadata or {})})
    return base_pb2.Node(id=instance, cluster=cluster, metadata=meta)


class Client:
    """One ADS stream: requests in, responses out, as Envoy drives it."""

    def __init__(self, setup: Setup, token: str | None, first_node: base_pb2.Node) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{setup.mgmt.grpc_port}")
        self.requests: queue.Queue[discovery_pb2.DiscoveryRequest | None] = queue.Queue()
        self.node = first_node
        metadata = [("authorization", f"Bearer {token}")] if token else []
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(self.channel)
        self.responses = stub.StreamAggregatedResources(
            iter(self.requests.get, None), metadata=metadata
        )

    def send(self, type_url: str, **fields: Any) -> None:
        self.requests.put(
            discovery_pb2.DiscoveryRequest(node=self.node, type_url=type_url, **fields)
        )

    def receive(self) -> discovery_pb2.DiscoveryResponse:
        return next(self.responses)

    def close(self) -> None:
        self.requests.put(None)
        self.channel.close()


@pytest.fixture
def client(setup: Setup) -> Iterator[Client]:
    c = Client(setup, setup.token(), node())
    try:
        yield c
    finally:
        c.close()


def gateway_entry(setup: Setup, instance: str) -> dict[str, Any] | None:
    status = ok(setup.admin.get(f"{CLUSTER_PATH}/status"))
    for entry in status["instances"]:
        if entry["kind"] == gc.GATEWAY_KIND and entry["instance"] == instance:
            return {**entry, "desired": status["desiredVersions"][gc.GATEWAY_KIND]}
    return None


def subscribe_all(client: Client) -> dict[str, discovery_pb2.DiscoveryResponse]:
    got = {}
    for type_url in TYPES:
        names = [gateway_xds.ROUTE_CONFIG_NAME] if type_url == gateway_xds.ROUTE_TYPE else []
        client.send(type_url, resource_names=names)
        response = client.receive()
        assert response.type_url == type_url
        got[type_url] = response
    return got


def test_each_type_is_answered_at_one_version_and_acked_into_the_status(
    setup: Setup, client: Client
) -> None:
    got = subscribe_all(client)
    versions = {r.version_info for r in got.values()}
    assert len(versions) == 1
    listener = listener_pb2.Listener()
    assert got[gateway_xds.LISTENER_TYPE].resources[0].Unpack(listener)
    assert listener.address.socket_address.port_value == 10000
    entry = gateway_entry(setup, "py-1")
    assert entry is not None and entry["lastResult"] == "" and entry["connected"]
    for type_url, response in got.items():
        client.send(type_url, version_info=response.version_info, response_nonce=response.nonce)
    wait_until(lambda: (gateway_entry(setup, "py-1") or {}).get("lastResult") == "ACK", 15, "ACK")
    entry = gateway_entry(setup, "py-1")
    assert entry is not None
    assert entry["appliedVersion"] == entry["desired"] == versions.pop()
    assert entry["upToDate"] is True


def test_a_nack_shows_the_error_and_a_stale_nonce_is_ignored(setup: Setup) -> None:
    c = Client(setup, setup.token(), node("py-nack"))
    try:
        got = subscribe_all(c)
        listeners = got[gateway_xds.LISTENER_TYPE]
        c.send(gateway_xds.LISTENER_TYPE, response_nonce="999999", version_info="x")  # stale
        c.send(
            gateway_xds.LISTENER_TYPE,
            response_nonce=listeners.nonce,
            error_detail=status_pb2.Status(code=3, message="listener refused: test detail"),
        )
        entry = wait_until(
            lambda: (e := gateway_entry(setup, "py-nack")) and e["lastResult"] == "NACK" and e,
            15,
            "the NACK",
        )
        assert entry["lastError"] == "listener refused: test detail"
        assert entry["nackedVersion"] == listeners.version_info
        assert entry["appliedVersion"] == ""
    finally:
        c.close()


def test_an_unknown_type_gets_no_answer(setup: Setup, client: Client) -> None:
    client.send("type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret")
    client.send(gateway_xds.CLUSTER_TYPE)
    assert client.receive().type_url == gateway_xds.CLUSTER_TYPE


def test_routes_are_sent_by_the_names_asked_for(setup: Setup, client: Client) -> None:
    client.send(gateway_xds.ROUTE_TYPE, resource_names=["other"])
    assert list(client.receive().resources) == []
    client.send(gateway_xds.ROUTE_TYPE, resource_names=[gateway_xds.ROUTE_CONFIG_NAME])
    assert len(client.receive().resources) == 1


def rpc_error(setup: Setup, token: str | None, first: base_pb2.Node) -> grpc.RpcError:
    c = Client(setup, token, first)
    try:
        c.send(gateway_xds.CLUSTER_TYPE)
        with pytest.raises(grpc.RpcError) as caught:
            c.receive()
        return caught.value
    finally:
        c.close()


@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("no token", grpc.StatusCode.UNAUTHENTICATED),
        ("the policy stream's audience", grpc.StatusCode.PERMISSION_DENIED),
        ("another cluster's credentials", grpc.StatusCode.PERMISSION_DENIED),
        ("a REST token", grpc.StatusCode.PERMISSION_DENIED),
        ("expired", grpc.StatusCode.PERMISSION_DENIED),
        ("the cluster agent's key", grpc.StatusCode.PERMISSION_DENIED),
    ],
)
def test_credentials_admit_only_their_own_cluster_and_audience(
    setup: Setup, case: str, code: grpc.StatusCode
) -> None:
    token = {
        "no token": None,
        "the policy stream's audience": setup.token(audience="meshplane:policy-distribution"),
        "another cluster's credentials": setup.token(cluster=OTHER),
        "a REST token": setup.rest_token(),
        "expired": setup.token(ttl=-60),
        "the cluster agent's key": load_credentials(setup.agent_keys[CLUSTER]).token(
            audience=gc.XDS_AUDIENCE
        ),
    }[case]
    assert rpc_error(setup, token, node()).code() == code


@pytest.mark.parametrize(
    ("first", "detail"),
    [
        (node(cluster="no-slash"), "ORGANIZATION/CLUSTER"),
        (node(instance=""), "node.id"),
        (node(metadata={gc.LISTENER_KEY: {"address": "gateway.local", "port": 80}}), "IP address"),
        (node(metadata={gc.LISTENER_KEY: {"address": "127.0.0.1", "port": 70000}}), "port"),
        (node(metadata={gc.RATELIMIT_SERVICE_KEY: "http://x:1"}), "grpc://"),
    ],
)
def test_a_malformed_node_is_invalid_argument(
    setup: Setup, first: base_pb2.Node, detail: str
) -> None:
    error = rpc_error(setup, setup.token(), first)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert detail in (error.details() or "")


def test_a_gateway_token_is_refused_on_rest(setup: Setup) -> None:
    response = setup.mgmt.client().get(
        f"{CLUSTER_PATH}", headers={"authorization": f"Bearer {setup.token()}"}
    )
    assert response.status_code == 401, response.text


def test_a_gateway_token_may_live_longer_than_the_cluster_token_ttl(setup: Setup) -> None:
    """Envoy cannot mint tokens; its bootstrap's lives 30 days. Other audiences may
    not (the cluster's tokenTtl, 1 h by default, still bounds them)."""
    long_lived = setup.token(ttl=gc.GATEWAY_TOKEN_TTL_SECONDS)
    c = Client(setup, long_lived, node("py-long"))
    try:
        c.send(gateway_xds.CLUSTER_TYPE)
        assert c.receive().type_url == gateway_xds.CLUSTER_TYPE
    finally:
        c.close()
    too_long = setup.token(ttl=gc.GATEWAY_TOKEN_TTL_SECONDS + 3600)
    assert rpc_error(setup, too_long, node()).code() == grpc.StatusCode.PERMISSION_DENIED


def test_metrics_count_gateways_and_their_answers(setup: Setup) -> None:
    """The distribution metrics read the registry the status reads: a NACKing
    gateway shows, by kind, with no instance names in the labels."""
    c = Client(setup, setup.token(), node("py-metrics"))
    try:
        got = subscribe_all(c)
        listeners = got[gateway_xds.LISTENER_TYPE]
        c.send(
            gateway_xds.LISTENER_TYPE,
            response_nonce=listeners.nonce,
            error_detail=status_pb2.Status(code=3, message="refused"),
        )
        wait_until(
            lambda: (gateway_entry(setup, "py-metrics") or {}).get("lastResult") == "NACK",
            15,
            "NACK",
        )
        text = setup.admin.get("/metrics").text
    finally:
        c.close()
    samples = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("mgmt_api_distribution_")
    }
    assert samples['mgmt_api_distribution_instances{kind="gateway",state="connected"}'] >= 1
    assert samples['mgmt_api_distribution_nacking_instances{kind="gateway"}'] >= 1
    assert samples['mgmt_api_distribution_events_total{event="nack",kind="gateway"}'] >= 1
    assert samples['mgmt_api_distribution_events_total{event="sent",kind="gateway"}'] >= 1
    assert "py-metrics" not in text
