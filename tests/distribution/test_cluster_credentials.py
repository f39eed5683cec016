"""Each cluster credential opens what its row of the table says, and nothing else.

The table is :data:`mgmt_api.domain.cluster_accounts.ACCOUNTS`. Every
(credential, thing it may ask for) pair runs against a real ``mgmt-api serve``
over its real REST and gRPC sockets: REST writes on the cluster (the issue's
reproduction 3: a tokenTtl of 720 h, a Backend pointing anywhere, an
HTTPRoute to it), the inventory report, the policy stream as extauthz and as
ratelimit, gateway ADS, sidecar ADS and the agent tunnel. Each stream token
carries the audience of the stream it is tried on, as an attacker holding
the key would mint it: only the account decides.
"""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import struct_pb2

from agent.contract import TUNNEL_AUDIENCE
from meshplane import gateway_contract as gc
from meshplane import sidecar_contract
from meshplane.control_plane import ServiceAccountKey, load_credentials
from meshplane.distribution_contract import TOKEN_AUDIENCE
from meshplane.proto.distribution.v1 import distribution_pb2 as dpb
from meshplane.proto.distribution.v1 import distribution_pb2_grpc as dpb_grpc
from meshplane.proto.tunnel.v1 import tunnel_pb2 as tpb
from meshplane.proto.tunnel.v1 import tunnel_pb2_grpc as tpb_grpc
from mgmt_api.auth.tokens import sign_service_account
from mgmt_api.compiler import gateway_xds
from mgmt_api.domain import cluster_accounts as accounts
from tests.mgmt_api.harness import MgmtServer, err, ok
from tests.mgmt_api.rbac_helpers import bound_account
from tests.support.cluster_credentials import private_jwk, write_credential
from tests.support.stream_probe import Held, first_answer

ORG = "scoped"
CLUSTER = "c1"
OTHER = "c2"
CLUSTER_PATH = f"/v2/organizations/{ORG}/clusters/{CLUSTER}"
COMPONENTS = tuple(a.name for a in accounts.ACCOUNTS)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "api.md"
DENIED = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)


class Setup:
    def __init__(self, tmp: Path) -> None:
        (tmp / "mgmt").mkdir()
        self.tmp = tmp
        self.mgmt = MgmtServer(data_dir=str(tmp / "mgmt")).start()
        self.admin = self.mgmt.admin()
        ok(self.admin.post("/v2/organizations", json={"name": ORG, "organization": {}}))
        self.created = {name: self._cluster(name) for name in (CLUSTER, OTHER)}

    def _cluster(self, name: str) -> dict[str, Any]:
        body = {"name": name, "cluster": {}}
        created: dict[str, Any] = ok(
            self.admin.post(f"/v2/organizations/{ORG}/clusters", json=body)
        )
        return created

    def key(self, component: str, cluster: str = CLUSTER) -> ServiceAccountKey:
        path = self.tmp / f"{cluster}-{component}.json"
        return load_credentials(write_credential(self.created[cluster], component, path))

    def rest(self, component: str) -> httpx.Client:
        """A REST client with a token of ``component``'s key (no stream audience)."""
        key = self.key(component)
        token = sign_service_account(private_jwk(key), key.subject or "", time.time(), 300)
        return self.mgmt.client(headers={"Authorization": f"Bearer {token}"})

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.mgmt.grpc_port}"

    def close(self) -> None:
        self.admin.close()
        self.mgmt.close()


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    st = Setup(Path(tmp_path_factory.mktemp("scoped")))
    try:
        yield st
    finally:
        st.close()


# ---- one opener per channel: None when admitted, else the refusal's code ----


def policy_stream(setup: Setup, token: str, kind: str) -> grpc.StatusCode | None:
    node = dpb.Node(kind=kind, organization=ORG, cluster=CLUSTER, instance="probe")
    with grpc.insecure_channel(setup.target) as channel:
        stub = dpb_grpc.PolicyDistributionStub(channel)  # type: ignore[no-untyped-call]
        metadata = [("authorization", f"Bearer {token}")]
        return first_answer(
            lambda held: stub.StreamSnapshots(iter(held), metadata=metadata, timeout=20),
            dpb.SnapshotRequest(node=node),
        )


def _ads_node(sidecar: bool) -> base_pb2.Node:
    meta = struct_pb2.Struct()
    if sidecar:
        node = sidecar_contract.SidecarNode(ORG, CLUSTER, "web-1", "shop", "web", "web", 8080)
        meta.update(node.metadata())
    else:
        meta.update({gc.LISTENER_KEY: {"address": "127.0.0.1", "port": 10000}})
    return base_pb2.Node(id="probe", cluster=f"{ORG}/{CLUSTER}", metadata=meta)


def ads(setup: Setup, token: str, *, sidecar: bool = False) -> grpc.StatusCode | None:
    first = discovery_pb2.DiscoveryRequest(
        node=_ads_node(sidecar), type_url=gateway_xds.CLUSTER_TYPE
    )
    with grpc.insecure_channel(setup.target) as channel:
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
        metadata = [("authorization", f"Bearer {token}")]
        return first_answer(
            lambda held: stub.StreamAggregatedResources(iter(held), metadata=metadata, timeout=20),
            first,
        )


def tunnel(setup: Setup, token: str) -> grpc.StatusCode | None:
    """The tunnel sends nothing first: admitted is its initial metadata on a live call."""
    hello = tpb.AgentHello(organization=ORG, cluster=CLUSTER, instance="probe")
    held = Held(tpb.AgentMessage(hello=hello))
    with grpc.insecure_channel(setup.target) as channel:
        stub = tpb_grpc.AgentTunnelStub(channel)  # type: ignore[no-untyped-call]
        call = stub.Connect(iter(held), metadata=[("authorization", f"Bearer {token}")])
        try:
            call.initial_metadata()  # on a refusal, arrives with the status
            code = None if not call.done() else call.code()
        finally:
            call.cancel()
            held.done.set()
    return code


def _stream_token(key: ServiceAccountKey, audience: str) -> str:
    return key.token(ttl=300, audience=audience)


OPENERS: dict[accounts.Channel, Callable[[Setup, ServiceAccountKey], grpc.StatusCode | None]] = {
    accounts.AGENT_TUNNEL: lambda s, k: tunnel(s, _stream_token(k, TUNNEL_AUDIENCE)),
    accounts.GATEWAY_ADS: lambda s, k: ads(s, _stream_token(k, gc.XDS_AUDIENCE)),
    accounts.SIDECAR_ADS: lambda s, k: ads(s, _stream_token(k, gc.XDS_AUDIENCE), sidecar=True),
    accounts.EXTAUTHZ_POLICIES: lambda s, k: policy_stream(
        s, _stream_token(k, TOKEN_AUDIENCE), "extauthz"
    ),
    accounts.RATELIMIT_POLICIES: lambda s, k: policy_stream(
        s, _stream_token(k, TOKEN_AUDIENCE), "ratelimit"
    ),
}


@pytest.mark.parametrize("channel", list(OPENERS), ids=lambda c: c.title.split(" (")[0])
@pytest.mark.parametrize("component", COMPONENTS)
def test_each_credential_opens_only_the_streams_of_its_row(
    setup: Setup, component: str, channel: accounts.Channel
) -> None:
    (account,) = [a for a in accounts.ACCOUNTS if a.name == component]
    code = OPENERS[channel](setup, setup.key(component))
    if channel in account.channels:
        assert code is None, f"the {component} key was refused the {channel.title}: {code}"
    else:
        assert code in DENIED, f"the {component} key got the {channel.title} ({code})"


@pytest.mark.parametrize("channel", list(OPENERS), ids=lambda c: c.title.split(" (")[0])
@pytest.mark.parametrize("component", COMPONENTS)
def test_another_clusters_credential_opens_nothing_here(
    setup: Setup, component: str, channel: accounts.Channel
) -> None:
    assert OPENERS[channel](setup, setup.key(component, OTHER)) in DENIED


REST_WRITES: dict[str, Callable[[Setup, httpx.Client], httpx.Response]] = {
    "PUT the cluster's tokenTtl": lambda s, c: c.put(
        CLUSTER_PATH,
        json={"tokenTtl": "720h", "etag": ok(s.admin.get(CLUSTER_PATH))["etag"]},
    ),
    "POST a Backend": lambda s, c: c.post(
        f"{CLUSTER_PATH}/backends",
        json={
            "name": "shop.evil",
            "backend": {"spec": {"endpoints": [{"ip": {"address": "192.0.2.1", "port": 80}}]}},
        },
    ),
    "POST an HTTPRoute": lambda s, c: c.post(
        f"{CLUSTER_PATH}/httproutes",
        json={
            "name": "shop.login",
            "httpRoute": {
                "spec": {
                    "parentRefs": [{"name": "gateway"}],
                    "rules": [
                        {
                            "matches": [{"path": {"type": "PathPrefix", "value": "/login"}}],
                            "backendRefs": [
                                {
                                    "group": "gateway.envoyproxy.io",
                                    "kind": "Backend",
                                    "name": "evil",
                                }
                            ],
                        }
                    ],
                }
            },
        },
    ),
    "read the cluster": lambda s, c: c.get(CLUSTER_PATH),
}


@pytest.mark.parametrize("write", list(REST_WRITES))
@pytest.mark.parametrize("component", COMPONENTS)
def test_no_credential_holds_a_rest_role_on_its_cluster(
    setup: Setup, component: str, write: str
) -> None:
    with setup.rest(component) as client:
        err(REST_WRITES[write](setup, client), 403, "PERMISSION_DENIED")
    assert ok(setup.admin.get(CLUSTER_PATH))["tokenTtl"] == "3600s"


@pytest.mark.parametrize("component", COMPONENTS)
def test_only_the_agent_reports_the_inventory(setup: Setup, component: str) -> None:
    body = {"namespaces": [], "state": {"provider": "static"}}
    with setup.rest(component) as client:
        response = client.put(f"{CLUSTER_PATH}/inventory", json=body)
    if accounts.INVENTORY_REPORT in accounts.ACCOUNTS[COMPONENTS.index(component)].channels:
        ok(response)
    else:
        err(response, 403, "PERMISSION_DENIED")


def test_revoking_the_gateway_key_ends_its_ads_stream(setup: Setup) -> None:
    """Per-key revocation: deleting the gateway's key closes its open stream."""
    created = ok(setup.admin.get(f"{CLUSTER_PATH}", params={"includeInstallTemplate": "true"}))
    path = setup.tmp / "revoked-gateway.json"
    key = load_credentials(write_credential(created, "gateway", path))
    held = Held(
        discovery_pb2.DiscoveryRequest(node=_ads_node(False), type_url=gateway_xds.CLUSTER_TYPE)
    )
    with grpc.insecure_channel(setup.target) as channel:
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
        metadata = [("authorization", f"Bearer {_stream_token(key, gc.XDS_AUDIENCE)}")]
        call = stub.StreamAggregatedResources(iter(held), metadata=metadata, timeout=60)
        try:
            next(call)  # admitted: the first answer
            account = f"{CLUSTER_PATH}/serviceaccounts/gateway"
            ok(setup.admin.delete(f"{account}/keys/{key.key_id}"))
            with pytest.raises(grpc.RpcError) as ended:
                for _ in call:
                    pass
            assert ended.value.code() == grpc.StatusCode.PERMISSION_DENIED
        finally:
            call.cancel()
            held.done.set()
    # the cluster's other gateway key (from its creation) still opens ADS
    assert OPENERS[accounts.GATEWAY_ADS](setup, setup.key("gateway")) is None


def test_the_template_mints_one_key_per_account_and_no_role(setup: Setup) -> None:
    template = setup.created[CLUSTER]["installTemplate"]
    assert set(template["helm"]["secrets"]) == {a.template_secret for a in accounts.ACCOUNTS}
    for account in accounts.ACCOUNTS:
        entry = template["helm"]["secrets"][account.template_secret]
        assert entry["serviceAccountFqn"] == accounts.account_fqn(
            f"organizations/{ORG}/clusters/{CLUSTER}", account.name
        )
        assert json.loads(entry["jwk"])["d"]  # the private key, in this answer only
    policy = ok(setup.admin.get(f"{CLUSTER_PATH}/policy"))
    assert "serviceaccounts/" not in json.dumps(policy)


@pytest.mark.parametrize("channel", accounts.CHANNELS, ids=lambda c: c.title.split(" (")[0])
@pytest.mark.parametrize("account", accounts.ACCOUNTS, ids=lambda a: a.name)
def test_the_table_row_by_row(account: accounts.Account, channel: accounts.Channel) -> None:
    """The pure rule: a key opens a channel of its own cluster iff its row lists it."""
    cluster = f"organizations/{ORG}/clusters/{CLUSTER}"
    sa_fqn = accounts.account_fqn(cluster, account.name)
    assert (accounts.refusal(sa_fqn, cluster, channel) is None) == (channel in account.channels)
    other = f"organizations/{ORG}/clusters/{OTHER}"
    assert accounts.refusal(sa_fqn, other, channel) is not None
    assert accounts.refusal(f"{cluster}/serviceaccounts/extra", cluster, channel) is not None
    assert accounts.channel_for(channel.audience, channel.kind) == channel


def test_the_docs_show_the_table_of_the_code() -> None:
    """docs/api.md shows the table inside the "Clusters" list (indented two spaces)."""
    assert textwrap.indent(accounts.docs_table(), "  ") in DOCS.read_text(encoding="utf-8")


def test_an_editor_of_the_cluster_cannot_recreate_a_component_account(setup: Setup) -> None:
    """Recreating ``.../serviceaccounts/extauthz`` mints a key that would open the policy
    stream: it needs SET_POLICY on the organization, like the template."""
    account = f"{CLUSTER_PATH}/serviceaccounts/extauthz"
    name = f"organizations/{ORG}/clusters/{OTHER}"
    ok(setup.admin.delete(f"/v2/{name}/serviceaccounts/extauthz"))
    # an editor of the whole organization: CREATE and WRITE everywhere, no SET_POLICY
    _, editor = bound_account(setup.mgmt, setup.admin, ORG, "rbac/editor", f"organizations/{ORG}")
    with editor:
        body = {"name": "extauthz", "serviceAccount": {}}
        err(editor.post(f"/v2/{name}/serviceaccounts", json=body), 403, "PERMISSION_DENIED")
        err(editor.post(f"{account}/keys"), 403, "PERMISSION_DENIED")  # nor mint a key
    err(setup.admin.get(f"/v2/{name}/serviceaccounts/extauthz"), 404)
