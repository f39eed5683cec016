"""The TLS shapes of a sidecar's resources (pure compile; Envoy's own protos parse them)."""

from __future__ import annotations

from typing import Any

from meshplane import workload_contract
from meshplane.sidecar_contract import SidecarNode
from mgmt_api.compiler import envoy_config, gateway_xds, sidecar_xds, tracing
from mgmt_api.compiler.sidecar_xds import SidecarEndpoint, SidecarInput
from mgmt_api.distribution.wire import pack

TD = "c1.acme.mesh.local"
NODE = SidecarNode("acme", "c1", "ns1-a", "ns1", "sa-a", "a", 8080, "10.0.0.1", 15006, 15001)
ENDPOINTS = (
    SidecarEndpoint("ns1", "b", "10.0.0.2", 15006, "sa-b"),
    SidecarEndpoint("ns1", "b", "10.0.0.3", 15006, "sa-b2"),
    SidecarEndpoint("ns2", "c", "10.0.0.4", 15006, "sa-c"),
)
SDS = sidecar_xds.secrets(("CA1\n", "CA2"))


def _context(socket: dict[str, Any]) -> dict[str, Any]:
    assert socket["name"] == "envoy.transport_sockets.tls"
    context: dict[str, Any] = socket["typedConfig"]["commonTlsContext"]
    svid = context["tlsCertificateSdsSecretConfigs"][0]
    assert svid["name"] == sidecar_xds.SVID_SECRET
    # The workload certificate comes from the pod-local agent's SDS, never over ADS.
    assert svid["sdsConfig"]["apiConfigSource"]["grpcServices"] == [
        {"envoyGrpc": {"clusterName": workload_contract.SDS_CLUSTER}}
    ]
    combined = context["combinedValidationContext"]
    ca = combined["validationContextSdsSecretConfig"]
    assert ca == {
        "name": sidecar_xds.CA_SECRET,
        "sdsConfig": {"ads": {}, "resourceApiVersion": "V3"},
    }
    return combined["defaultValidationContext"]  # type: ignore[no-any-return]


def test_inbound_requires_a_mesh_client_certificate_and_outbound_pins_the_callee_ids() -> None:
    resources = sidecar_xds.compile_sidecar(SidecarInput("c1", ENDPOINTS, TD), NODE, SDS)
    inbound = resources.listeners[0]
    socket = inbound["filterChains"][0]["transportSocket"]
    assert socket["typedConfig"]["requireClientCertificate"] is True
    assert _context(socket)["matchTypedSubjectAltNames"] == [
        {"sanType": "URI", "matcher": {"prefix": f"spiffe://{TD}/"}}
    ]
    assert "transportSocket" not in resources.listeners[1]["filterChains"][0]  # app's loopback
    clusters = {c["name"]: c for c in resources.clusters}
    assert "transportSocket" not in clusters[sidecar_xds.APP_CLUSTER]
    sans = _context(clusters["outbound/ns1/b"]["transportSocket"])["matchTypedSubjectAltNames"]
    assert [s["matcher"]["exact"] for s in sans] == [
        f"spiffe://{TD}/ns/ns1/sa/sa-b",
        f"spiffe://{TD}/ns/ns1/sa/sa-b2",
    ]
    assert resources.secrets == SDS
    for type_url, items in resources.by_type().items():  # Envoy's protos accept every one
        for item in items:
            pack(type_url, item)
    # mgmt-api serves the trust bundle only (both CAs of a rotation, concatenated): no key.
    (bundle,) = resources.by_type()[gateway_xds.SECRET_TYPE]
    assert bundle == {
        "name": "mesh-ca",
        "validationContext": {"trustedCa": {"inlineString": "CA1\nCA2\n"}},
    }


def test_the_version_follows_the_trust_domain_and_the_callee_accounts() -> None:
    inp = SidecarInput("c1", ENDPOINTS, TD)
    assert inp.version() != SidecarInput("c1", ENDPOINTS, "other.td").version()
    moved = (*ENDPOINTS[:2], SidecarEndpoint("ns2", "c", "10.0.0.4", 15006, "sa-c2"))
    assert inp.version() != SidecarInput("c1", moved, TD).version()


def test_the_clusters_tracer_reaches_both_sidecar_listeners_and_the_version() -> None:
    """ClusterConfig's ``tracing`` (issue 27): the sidecar reports as SERVICE.NAMESPACE."""
    traced = envoy_config.GatewaySettings(
        tracing=tracing.TracingSettings(collector="grpc://otel:4317", sampling_percentage=5.0)
    )
    inp = SidecarInput("c1", ENDPOINTS, TD, knobs=traced)
    assert inp.version() != SidecarInput("c1", ENDPOINTS, TD).version()
    resources = sidecar_xds.compile_sidecar(inp, NODE, SDS)
    for listener in resources.listeners:
        manager = listener["filterChains"][0]["filters"][0]["typedConfig"]
        assert manager["tracing"]["randomSampling"] == {"value": 5.0}
        assert manager["tracing"]["provider"]["typedConfig"]["serviceName"] == "a.ns1"
    assert tracing.COLLECTOR_CLUSTER in {c["name"] for c in resources.clusters}
    for type_url, items in resources.by_type().items():
        for item in items:
            pack(type_url, item)
    untraced = sidecar_xds.compile_sidecar(SidecarInput("c1", ENDPOINTS, TD), NODE, SDS)
    assert all(
        "tracing" not in listener["filterChains"][0]["filters"][0]["typedConfig"]
        for listener in untraced.listeners
    )
