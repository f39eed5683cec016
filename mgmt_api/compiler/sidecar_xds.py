"""A workload sidecar's whole Envoy configuration, as the xDS resources of mgmt-api's ADS.

The shape (docs/mesh.md):

- **inbound listener** (``inbound``) on the address the sidecar's node names:
  an HTTP connection manager whose one route (over RDS, ``inbound``) sends
  everything to the app on loopback (cluster ``inbound/app``). The authorization filters of the
  workload's namespace go in front of the router (:func:`inbound_http_filters`,
  the extension point; :mod:`mgmt_api.compiler.mesh_authz` fills it with the
  mode's RBAC, the local JWT rules and ext_authz; tracing plugs in there too);
- **outbound listener** (``outbound``) on ``127.0.0.1:outboundPort``: ONE local
  listener, its routes over RDS (``outbound``) so a new service reaches open
  connections too, with a virtual host per service of the cluster named
  ``SERVICE.NAMESPACE`` (and ``SERVICE.NAMESPACE.svc.cluster.local``; bare
  ``SERVICE`` for the sidecar's own namespace). The app calls
  ``http://127.0.0.1:OUTBOUND/`` with that ``Host``; an unknown name is 404;
- **clusters**: ``inbound/app`` (STATIC) and one EDS cluster
  ``outbound/NAMESPACE/SERVICE`` per service, whose endpoints come over ADS
  as that cluster's ``ClusterLoadAssignment`` (:func:`load_assignment`): the
  inbound addresses of the service's sidecars in the mesh's registry. An
  instance joining or leaving changes that one assignment, not the clusters;
- **mTLS** (when the input has a trust domain, which mgmt-api always gives):
  the inbound listener requires a client certificate of the cluster's mesh CA
  with a URI SAN in the trust domain, so Envoy's RBAC sees the caller's
  ``spiffe://TD/ns/NS/sa/SA`` as ``principal.authenticated.principal_name``;
  each outbound cluster presents the sidecar's own certificate and accepts
  only the SPIFFE ids of the callee service's connected sidecars. Both take
  the workload certificate (:data:`SVID_SECRET`) over SDS from the pod-local
  sidecar agent (the bootstrap's :data:`~meshplane.workload_contract.SDS_CLUSTER`),
  which holds its key, and the trust bundle (:data:`CA_SECRET`) over SDS on
  the ADS stream (:func:`secrets`), so a CA rotation is one secret push.

Pure: no store, no clock. :meth:`SidecarInput.version` is the digest of the
cluster-wide input; what differs between sidecars is fixed for a stream.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from meshplane import workload_contract
from meshplane.sidecar_contract import SidecarNode, spiffe_id
from mgmt_api.compiler import denials, envoy_config, mesh_authz, tracing
from mgmt_api.compiler.gateway_xds import (
    HCM_FILTER,
    PATH_NORMALIZATION,
    ROUTER_FILTER,
    UPSTREAM_CONNECT_TIMEOUT,
    GatewayResources,
)
from mgmt_api.compiler.protojson import JsonDict

INBOUND_LISTENER = "inbound"
OUTBOUND_LISTENER = "outbound"
OUTBOUND_ROUTES = "outbound"
INBOUND_ROUTES = "inbound"
APP_CLUSTER = "inbound/app"
_TYPE = "type.googleapis.com/"
_HCM = _TYPE + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_ROUTER = _TYPE + "envoy.extensions.filters.http.router.v3.Router"
_TLS = _TYPE + "envoy.extensions.transport_sockets.tls.v3."
TLS_SOCKET = "envoy.transport_sockets.tls"
#: SDS secret names: the sidecar's workload certificate and key, and its cluster's mesh CA.
SVID_SECRET = workload_contract.SVID_SECRET
CA_SECRET = workload_contract.CA_SECRET


@dataclass(frozen=True, order=True)
class SidecarEndpoint:
    """One connected sidecar, as the others reach it."""

    namespace: str
    service: str
    host: str
    port: int
    service_account: str = "default"


@dataclass(frozen=True)
class SidecarInput:
    """What a cluster's sidecars are configured from.

    ``settings`` are every SecuritySetting whose group reaches the cluster,
    with the namespaces their group and workspace select there: a change of
    membership is a change of input, so of :meth:`version`, and reaches every
    sidecar over ADS with no restart. ``knobs`` are the cluster's ext_authz
    timeout and failure mode (the gateways' own).
    """

    cluster: str
    endpoints: tuple[SidecarEndpoint, ...] = ()  # sorted
    trust_domain: str = ""  # "": plaintext (only pure tests build such an input)
    settings: tuple[mesh_authz.MeshSetting, ...] = ()
    knobs: envoy_config.GatewaySettings = field(default_factory=envoy_config.GatewaySettings)

    def version(self) -> str:
        """Digest of everything cluster-wide a sidecar's resources depend on.

        The certificates are not in it: a rotation changes the SDS secret
        only, and the status keeps comparing configuration versions.
        """
        content = {
            "cluster": self.cluster,
            "trustDomain": self.trust_domain,
            "endpoints": [
                [e.namespace, e.service, e.host, e.port, e.service_account] for e in self.endpoints
            ],
            "settings": [s.to_json() for s in self.settings],
            "extAuthz": [self.knobs.ext_authz_timeout, self.knobs.ext_authz_failure_mode_allow],
            "tracing": tracing.document_section(self.knobs.tracing),
        }
        encoded = json.dumps(content, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(encoded).hexdigest()[:20]

    def services(self) -> dict[tuple[str, str], list[SidecarEndpoint]]:
        """(namespace, service) → its endpoints, in order."""
        out: dict[tuple[str, str], list[SidecarEndpoint]] = {}
        for endpoint in self.endpoints:
            out.setdefault((endpoint.namespace, endpoint.service), []).append(endpoint)
        return out


def _socket(host: str, port: int) -> JsonDict:
    return {"socketAddress": {"address": host, "portValue": port}}


def _router() -> JsonDict:
    return {"name": ROUTER_FILTER, "typedConfig": {"@type": _ROUTER}}


def _sds(name: str) -> JsonDict:
    """Where Envoy gets secret ``name``: the workload certificate from the pod-local
    agent's SDS, the trust bundle on the ADS stream."""
    if name == SVID_SECRET:
        source: JsonDict = {
            "apiConfigSource": {
                "apiType": "GRPC",
                "transportApiVersion": "V3",
                "grpcServices": [{"envoyGrpc": {"clusterName": workload_contract.SDS_CLUSTER}}],
            },
            "resourceApiVersion": "V3",
        }
    else:
        source = {"ads": {}, "resourceApiVersion": "V3"}
    return {"name": name, "sdsConfig": source}


def _validation(sans: list[JsonDict]) -> JsonDict:
    """The mesh CA over SDS, and which URI SANs a peer's certificate must carry."""
    return {
        "combinedValidationContext": {
            "defaultValidationContext": {"matchTypedSubjectAltNames": sans},
            "validationContextSdsSecretConfig": _sds(CA_SECRET),
        }
    }


def _uri_san(matcher: JsonDict) -> JsonDict:
    return {"sanType": "URI", "matcher": matcher}


def downstream_tls(inp: SidecarInput) -> JsonDict:
    """The inbound listener's TLS: a client certificate of the mesh CA, in the trust domain."""
    context = {
        "@type": _TLS + "DownstreamTlsContext",
        "requireClientCertificate": True,
        "commonTlsContext": {
            "tlsCertificateSdsSecretConfigs": [_sds(SVID_SECRET)],
            **_validation([_uri_san({"prefix": f"spiffe://{inp.trust_domain}/"})]),
        },
    }
    return {"name": TLS_SOCKET, "typedConfig": context}


def upstream_tls(inp: SidecarInput, endpoints: list[SidecarEndpoint]) -> JsonDict:
    """An outbound cluster's TLS: present our certificate, accept only the callee's ids."""
    ids = sorted({spiffe_id(inp.trust_domain, e.namespace, e.service_account) for e in endpoints})
    context = {
        "@type": _TLS + "UpstreamTlsContext",
        "commonTlsContext": {
            "tlsCertificateSdsSecretConfigs": [_sds(SVID_SECRET)],
            **_validation([_uri_san({"exact": i}) for i in ids]),
        },
    }
    return {"name": TLS_SOCKET, "typedConfig": context}


def secrets(trust_bundle: tuple[str, ...]) -> tuple[JsonDict, ...]:
    """The one SDS secret mgmt-api serves a sidecar: the trust bundle (CA PEMs,
    concatenated). No key: the workload's stays in its pod."""
    pems = "".join(p if p.endswith("\n") else p + "\n" for p in trust_bundle)
    return ({"name": CA_SECRET, "validationContext": {"trustedCa": {"inlineString": pems}}},)


#: The type of an EDS resource (a cluster's endpoints).
ENDPOINT_TYPE = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"


def _assignment(name: str, endpoints: list[tuple[str, int]]) -> JsonDict:
    return {
        "clusterName": name,
        "endpoints": [
            {"lbEndpoints": [{"endpoint": {"address": _socket(h, p)}} for h, p in endpoints]}
        ],
    }


def _static_cluster(name: str, endpoints: list[tuple[str, int]]) -> JsonDict:
    return {
        "name": name,
        "type": "STATIC",
        "connectTimeout": UPSTREAM_CONNECT_TIMEOUT,
        "loadAssignment": _assignment(name, endpoints),
    }


def outbound_cluster_name(namespace: str, service: str) -> str:
    return f"outbound/{namespace}/{service}"


def inbound_authz(inp: SidecarInput, node: SidecarNode) -> mesh_authz.InboundAuthz:
    """What the workload's SecuritySetting compiles into on the inbound listener
    (:mod:`mgmt_api.compiler.mesh_authz`: mode RBAC, local JWT rules, ext_authz)."""
    return mesh_authz.compile_inbound(inp.settings, inp.trust_domain, node.namespace, inp.knobs)


def inbound_http_filters(inp: SidecarInput, node: SidecarNode) -> list[JsonDict]:
    """The HTTP filters before the router on the inbound listener.

    The extension point for what a workload's SecuritySetting compiles into
    (authorization mode, local JWT rules, ext_authz: :func:`inbound_authz`)
    and for tracing: each appends its filters here, in that order.
    """
    return inbound_authz(inp, node).http_filters


def inbound_listener(inp: SidecarInput, node: SidecarNode) -> JsonDict:
    """The listener in front of the app (see the module docstring); its route
    comes over RDS (:func:`inbound_routes`) so that authorization changes
    reach open connections."""
    manager: JsonDict = {
        "@type": _HCM,
        "statPrefix": "inbound",
        # Local JWT rules match paths: they must see the normalized one.
        **PATH_NORMALIZATION,
        "rds": {
            "routeConfigName": INBOUND_ROUTES,
            "configSource": {"ads": {}, "resourceApiVersion": "V3"},
        },
        "httpFilters": [*inbound_http_filters(inp, node), _router()],
        # Every refusal says why: reason header, decision id, one decision line.
        **denials.denial_settings("sidecar"),
        **_tracing(inp, node),
    }
    chain: JsonDict = {"filters": [{"name": HCM_FILTER, "typedConfig": manager}]}
    if inp.trust_domain:
        chain["transportSocket"] = downstream_tls(inp)
    return {
        "name": INBOUND_LISTENER,
        "address": _socket(node.inbound_host, node.inbound_port),
        "filterChains": [chain],
    }


def inbound_routes(authz: mesh_authz.InboundAuthz) -> JsonDict:
    """The inbound route: everything to the app, with the setting's per-route config."""
    route: JsonDict = {"match": {"prefix": "/"}, "route": {"cluster": APP_CLUSTER}}
    if authz.route_config:
        route["typedPerFilterConfig"] = authz.route_config
    if authz.route_metadata:
        route["metadata"] = authz.route_metadata
    return {
        "name": INBOUND_ROUTES,
        "virtualHosts": [{"name": "app", "domains": ["*"], "routes": [route]}],
    }


def _tracing(inp: SidecarInput, node: SidecarNode) -> JsonDict:
    """The cluster's Envoy tracer (ClusterConfig's ``tracing``) on a sidecar's
    connection managers, reporting as ``SERVICE.NAMESPACE``; nothing when off."""
    if inp.knobs.tracing is None:
        return {}
    return {"tracing": tracing.hcm_tracing(inp.knobs.tracing, f"{node.service}.{node.namespace}")}


def outbound_listener(inp: SidecarInput, node: SidecarNode) -> JsonDict:
    """The app's one local listener for every outbound call."""
    manager = {
        "@type": _HCM,
        "statPrefix": "outbound",
        "stripAnyHostPort": True,
        "rds": {
            "routeConfigName": OUTBOUND_ROUTES,
            "configSource": {"ads": {}, "resourceApiVersion": "V3"},
        },
        "httpFilters": [_router()],
        **_tracing(inp, node),
    }
    return {
        "name": OUTBOUND_LISTENER,
        "address": _socket("127.0.0.1", node.outbound_port),
        "filterChains": [{"filters": [{"name": HCM_FILTER, "typedConfig": manager}]}],
    }


def _domains(namespace: str, service: str, node: SidecarNode) -> list[str]:
    names = [f"{service}.{namespace}", f"{service}.{namespace}.svc.cluster.local"]
    if namespace == node.namespace:
        names.append(service)
    return names


def outbound_routes(inp: SidecarInput, node: SidecarNode) -> JsonDict:
    """A virtual host per service by name; anything else is Envoy's 404."""
    virtual_hosts = [
        {
            "name": f"{service}.{namespace}",
            "domains": _domains(namespace, service, node),
            "routes": [
                {
                    "match": {"prefix": "/"},
                    "route": {"cluster": outbound_cluster_name(namespace, service)},
                }
            ],
        }
        for namespace, service in sorted(inp.services())
    ]
    virtual_hosts.append({"name": "unknown", "domains": ["*"], "routes": []})
    return {"name": OUTBOUND_ROUTES, "virtualHosts": virtual_hosts, "validateClusters": False}


def app_cluster(app_port: int) -> JsonDict:
    """The inbound listener's upstream: the app on loopback."""
    return _static_cluster(APP_CLUSTER, [("127.0.0.1", app_port)])


def outbound_cluster(
    inp: SidecarInput, namespace: str, service: str, endpoints: list[SidecarEndpoint]
) -> JsonDict:
    """The EDS cluster of one service as its callers reach it (the same for every caller):
    its endpoints are :func:`load_assignment`'s, its TLS accepts the ids of ``endpoints``."""
    cluster: JsonDict = {
        "name": outbound_cluster_name(namespace, service),
        "type": "EDS",
        "connectTimeout": UPSTREAM_CONNECT_TIMEOUT,
        "edsClusterConfig": {"edsConfig": {"ads": {}, "resourceApiVersion": "V3"}},
    }
    if inp.trust_domain:
        cluster["transportSocket"] = upstream_tls(inp, endpoints)
    return cluster


def load_assignment(namespace: str, service: str, endpoints: list[SidecarEndpoint]) -> JsonDict:
    """The endpoints of a service's outbound cluster (an EDS resource)."""
    name = outbound_cluster_name(namespace, service)
    return _assignment(name, [(e.host, e.port) for e in endpoints])


def load_assignments(inp: SidecarInput) -> list[JsonDict]:
    """Every outbound cluster's endpoints, by cluster name."""
    return [load_assignment(ns, svc, e) for (ns, svc), e in sorted(inp.services().items())]


def policy_digest(inp: SidecarInput) -> str:
    """Digest of what a sidecar's listeners and inbound route depend on (not the endpoints)."""
    content = {
        "cluster": inp.cluster,
        "trustDomain": inp.trust_domain,
        "settings": [s.to_json() for s in inp.settings],
        "extAuthz": [inp.knobs.ext_authz_timeout, inp.knobs.ext_authz_failure_mode_allow],
        "tracing": tracing.document_section(inp.knobs.tracing),
    }
    encoded = json.dumps(content, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:20]


def compile_sidecar(
    inp: SidecarInput, node: SidecarNode, sds: tuple[JsonDict, ...] = ()
) -> GatewayResources:
    """The listeners, routes and clusters of one sidecar; ``sds``: its :func:`secrets`."""
    authz = inbound_authz(inp, node)
    clusters = [app_cluster(node.app_port)]
    clusters.extend(authz.clusters)
    for (namespace, service), endpoints in sorted(inp.services().items()):
        clusters.append(outbound_cluster(inp, namespace, service, endpoints))
    if inp.knobs.tracing is not None:
        clusters.append(tracing.collector_cluster(inp.knobs.tracing))
    return GatewayResources(
        listeners=(inbound_listener(inp, node), outbound_listener(inp, node)),
        route_configurations=(outbound_routes(inp, node), inbound_routes(authz)),
        clusters=tuple(clusters),
        warnings=(),
        secrets=sds,
    )
