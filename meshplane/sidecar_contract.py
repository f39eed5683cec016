"""A workload sidecar's contract with the management plane's ADS server, and its bootstrap.

A sidecar is an Envoy beside one workload. It boots, like a gateway, from a
minimal bootstrap (:func:`bootstrap`: node, admin, the ADS cluster) and takes
everything else from mgmt-api's ADS server on the policy stream's gRPC port.
What makes the node a sidecar is :data:`SIDECAR_KEY` in ``node.metadata``:

- ``namespace``, ``serviceAccount``: the workload's identity;
- ``service``: the service name other sidecars route to (``SERVICE.NAMESPACE``);
- ``appPort``: where the app listens on loopback (the inbound listener's target);
- ``inbound``: ``{address, port}`` the sidecar accepts calls on; it is also the
  endpoint other sidecars reach this instance at, so it must be routable from
  them (the pod IP, or 127.0.0.1 when everything runs on one host);
- ``outboundPort``: the loopback port the app sends its outbound calls to.

``node.cluster`` is ``ORGANIZATION/CLUSTER`` and ``node.id`` the instance, as
for gateways. A sidecar does not authenticate itself: the pod-local sidecar
agent (``meshplane-sidecar-agent``, :mod:`meshplane.workload_contract`) does,
with the pod's own token, and Envoy reaches it over Unix sockets in a
directory only the two share. So :func:`bootstrap` holds no bearer token and
no key: its ADS cluster (:data:`~meshplane.gateway_contract.XDS_CLUSTER`) and
SDS cluster (:data:`~meshplane.workload_contract.SDS_CLUSTER`) are pipes to
the agent's sockets, and Envoy's admin API is a pipe too, never a TCP port
the app (or anything else in the pod's network namespace) could reach.

Nothing here imports a server package.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from meshplane import gateway_contract, workload_contract
from meshplane.admin_allowlist import ALLOWED, PROMETHEUS_PATH
from meshplane.gateway_contract import NodeError

#: The ``kind`` sidecars show with in the cluster status.
SIDECAR_KIND = "sidecar"
#: The node.metadata key that makes a node a sidecar.
SIDECAR_KEY = "meshplane.sidecar"
DEFAULT_OUTBOUND_PORT = 15001
DEFAULT_INBOUND_PORT = 15006
#: The pod port of the mTLS diagnostics listener (the cluster agent's only way in).
DEFAULT_DIAGNOSTICS_PORT = 15021
#: The pod port of the metrics-only listener Prometheus scrapes (Istio's 15090).
DEFAULT_PROMETHEUS_PORT = 15090
#: The Envoy cluster of the admin API's socket, behind those two listeners.
ADMIN_CLUSTER = "meshplane_admin"
#: The control plane's CA bundle (PEM) by value, for the agent when no file is given
#: (the injector passes it so: a CA certificate is public, a volume would need an
#: object per namespace).
CONTROL_PLANE_CA_ENV = "MESHPLANE_CONTROL_PLANE_CA"

# DNS-1123 labels: namespaces, service accounts, services.
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class SidecarNode:
    """One sidecar Envoy, as its bootstrap's ``node`` describes it."""

    organization: str
    cluster: str
    instance: str
    namespace: str
    service_account: str
    service: str
    app_port: int
    inbound_host: str = "127.0.0.1"
    inbound_port: int = DEFAULT_INBOUND_PORT
    outbound_port: int = DEFAULT_OUTBOUND_PORT

    @property
    def node_cluster(self) -> str:
        return f"{self.organization}/{self.cluster}"

    def metadata(self) -> dict[str, Any]:
        return {
            SIDECAR_KEY: {
                "namespace": self.namespace,
                "serviceAccount": self.service_account,
                "service": self.service,
                "appPort": self.app_port,
                "inbound": {"address": self.inbound_host, "port": self.inbound_port},
                "outboundPort": self.outbound_port,
            }
        }


def spiffe_id(trust_domain: str, namespace: str, service_account: str) -> str:
    """A workload's SPIFFE id: what its certificate's URI SAN says, and RBAC matches on."""
    return f"spiffe://{trust_domain}/ns/{namespace}/sa/{service_account}"


def is_sidecar(metadata: Mapping[str, Any]) -> bool:
    """Whether an Envoy node's metadata (as a dict) announces a sidecar."""
    return SIDECAR_KEY in metadata


def _port(value: Any, what: str) -> int:
    if isinstance(value, float) and value.is_integer():  # protobuf Struct numbers are doubles
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 65536:
        raise NodeError(f"node.metadata[{SIDECAR_KEY!r}].{what} must be a port 1-65535")
    return value


def _label(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _LABEL.match(value):
        raise NodeError(
            f"node.metadata[{SIDECAR_KEY!r}].{what} must be a DNS-1123 label, not {value!r}"
        )
    return value


def parse_node(node_id: str, node_cluster: str, metadata: Mapping[str, Any]) -> SidecarNode:
    """The :class:`SidecarNode` of an Envoy ``Node``; :class:`NodeError` names the bad field."""
    base = gateway_contract.parse_node(node_id, node_cluster, {})
    meta = metadata.get(SIDECAR_KEY)
    if not isinstance(meta, Mapping):
        raise NodeError(f"node.metadata[{SIDECAR_KEY!r}] must be an object")
    inbound = meta.get("inbound", {})
    if not isinstance(inbound, Mapping):
        raise NodeError(f"node.metadata[{SIDECAR_KEY!r}].inbound must be {{address, port}}")
    host = inbound.get("address", "127.0.0.1")
    try:
        ipaddress.ip_address(host)
    except (ValueError, TypeError):
        raise NodeError(
            f"node.metadata[{SIDECAR_KEY!r}].inbound.address must be an IP address, not {host!r}"
        ) from None
    node = SidecarNode(
        base.organization,
        base.cluster,
        node_id,
        namespace=_label(meta.get("namespace"), "namespace"),
        service_account=_label(meta.get("serviceAccount"), "serviceAccount"),
        service=_label(meta.get("service"), "service"),
        app_port=_port(meta.get("appPort"), "appPort"),
        inbound_host=host,
        inbound_port=_port(inbound.get("port", DEFAULT_INBOUND_PORT), "inbound.port"),
        outbound_port=_port(meta.get("outboundPort", DEFAULT_OUTBOUND_PORT), "outboundPort"),
    )
    ports = {node.app_port, node.inbound_port, node.outbound_port}
    if len(ports) != 3:
        raise NodeError(
            f"node.metadata[{SIDECAR_KEY!r}]: appPort, inbound.port and outboundPort must differ"
        )
    return node


#: The longest socket path (bytes) a sidecar's directory may give (sun_path holds 108).
MAX_SOCKET_PATH = 100


@dataclass(frozen=True)
class Sockets:
    """The pod-local socket paths of one sidecar (in a directory only Envoy and the agent share)."""

    directory: str

    def path(self, name: str) -> str:
        return str(PurePosixPath(self.directory) / name)

    @property
    def xds(self) -> str:
        return self.path(workload_contract.XDS_SOCKET)

    @property
    def sds(self) -> str:
        return self.path(workload_contract.SDS_SOCKET)

    @property
    def admin(self) -> str:
        return self.path(workload_contract.ADMIN_SOCKET)

    def fits(self) -> bool:
        """Whether every socket path is short enough for a Unix socket."""
        return all(len(p.encode()) <= MAX_SOCKET_PATH for p in (self.xds, self.sds, self.admin))


def _pipe(path: str) -> dict[str, Any]:
    return {"pipe": {"path": path}}


def _pipe_cluster(name: str, path: str) -> dict[str, Any]:
    """A static HTTP/2 cluster of one Unix socket (the agent's ADS or SDS server)."""
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3."
                "HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _pipe(path)}}]}],
        },
    }


@dataclass(frozen=True)
class PodPorts:
    """The admin API's two doors on the pod network (each 0: closed).

    ``diagnostics``: mTLS, the allow-listed admin paths only
    (:data:`meshplane.admin_allowlist.ALLOWED`), for a client certificate of
    the mesh CA whose URI SAN is the cluster agent's SPIFFE id
    (``caller``: ``NAMESPACE/SERVICEACCOUNT``, in whatever trust domain the
    mesh CA signs: that CA is the cluster's alone). ``prometheus``: plain
    HTTP, ``GET /stats/prometheus`` only.
    """

    diagnostics: int = 0
    caller: str = ""
    prometheus: int = 0

    def caller_san_regex(self) -> str:
        namespace, _, account = self.caller.partition("/")
        return f"^spiffe://[^/]+/ns/{re.escape(namespace)}/sa/{re.escape(account)}$"


def parse_caller(value: str) -> str:
    """``NAMESPACE/SERVICEACCOUNT`` of the diagnostics caller; ValueError says why."""
    namespace, sep, account = value.partition("/")
    if not sep or not _LABEL.match(namespace) or not _LABEL.match(account):
        raise ValueError(f"must be NAMESPACE/SERVICEACCOUNT (DNS-1123 labels), not {value!r}")
    return value


def _http_listener(name: str, host: str, port: int, routes: list[dict[str, Any]]) -> dict[str, Any]:
    """A listener whose one virtual host has ``routes``, then a 404 for everything else."""
    fallback = {"match": {"prefix": "/"}, "direct_response": {"status": 404}}
    manager = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager."
        "v3.HttpConnectionManager",
        "stat_prefix": name,
        "normalize_path": True,
        "merge_slashes": True,
        "route_config": {
            "name": name,
            "virtual_hosts": [{"name": name, "domains": ["*"], "routes": [*routes, fallback]}],
        },
        "http_filters": [
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            }
        ],
    }
    return {
        "name": name,
        "address": {"socket_address": {"address": host, "port_value": port}},
        "filter_chains": [
            {
                "filters": [
                    {
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": manager,
                    }
                ]
            }
        ],
    }


def _admin_route(path: str, method: str) -> dict[str, Any]:
    match = {"path": path, "headers": [{"name": ":method", "string_match": {"exact": method}}]}
    return {"match": match, "route": {"cluster": ADMIN_CLUSTER, "timeout": "60s"}}


def _diagnostics_tls(ports: PodPorts) -> dict[str, Any]:
    """Our workload certificate; the caller's must chain to the mesh CA and be the agent's."""
    svid = {
        "name": workload_contract.SVID_SECRET,
        "sds_config": {
            "api_config_source": {
                "api_type": "GRPC",
                "transport_api_version": "V3",
                "grpc_services": [{"envoy_grpc": {"cluster_name": workload_contract.SDS_CLUSTER}}],
            },
            "resource_api_version": "V3",
        },
    }
    ca = {
        "name": workload_contract.CA_SECRET,
        "sds_config": {"ads": {}, "resource_api_version": "V3"},
    }
    san = {"san_type": "URI", "matcher": {"safe_regex": {"regex": ports.caller_san_regex()}}}
    context = {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3."
        "DownstreamTlsContext",
        "require_client_certificate": True,
        "common_tls_context": {
            "tls_certificate_sds_secret_configs": [svid],
            "combined_validation_context": {
                "default_validation_context": {"match_typed_subject_alt_names": [san]},
                "validation_context_sds_secret_config": ca,
            },
        },
    }
    return {"name": "envoy.transport_sockets.tls", "typed_config": context}


def _pod_listeners(node: SidecarNode, ports: PodPorts) -> list[dict[str, Any]]:
    listeners: list[dict[str, Any]] = []
    if ports.diagnostics:
        routes = [_admin_route(path, e.method) for path, e in sorted(ALLOWED.items())]
        listener = _http_listener(
            "meshplane_diagnostics", node.inbound_host, ports.diagnostics, routes
        )
        listener["filter_chains"][0]["transport_socket"] = _diagnostics_tls(ports)
        listeners.append(listener)
    if ports.prometheus:
        routes = [_admin_route(PROMETHEUS_PATH, "GET")]
        listeners.append(
            _http_listener("meshplane_prometheus", node.inbound_host, ports.prometheus, routes)
        )
    return listeners


def _admin_cluster(sockets: Sockets) -> dict[str, Any]:
    return {
        "name": ADMIN_CLUSTER,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": ADMIN_CLUSTER,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _pipe(sockets.admin)}}]}],
        },
    }


def bootstrap(node: SidecarNode, sockets: Sockets, ports: PodPorts | None = None) -> dict[str, Any]:
    """A sidecar's whole bootstrap: node, admin on a pipe, ADS and SDS through the agent,
    and (``ports``) the admin API's two narrow doors on the pod network.

    Listeners, routes, clusters and the trust bundle come over ADS (relayed
    by the agent), the workload certificate over SDS (served by the agent);
    Envoy keeps its last configuration while mgmt-api is away. Nothing in it
    is a secret.
    """
    ads_source = {"ads": {}, "resource_api_version": "V3"}
    ports = ports or PodPorts()
    clusters = [
        _pipe_cluster(gateway_contract.XDS_CLUSTER, sockets.xds),
        _pipe_cluster(workload_contract.SDS_CLUSTER, sockets.sds),
    ]
    listeners = _pod_listeners(node, ports)
    if listeners:
        clusters.append(_admin_cluster(sockets))
    return {
        "node": {"id": node.instance, "cluster": node.node_cluster, "metadata": node.metadata()},
        "admin": {"address": _pipe(sockets.admin)},
        "dynamic_resources": {
            "ads_config": {
                "api_type": "GRPC",
                "transport_api_version": "V3",
                "set_node_on_first_message_only": True,
                "grpc_services": [{"envoy_grpc": {"cluster_name": gateway_contract.XDS_CLUSTER}}],
            },
            "cds_config": ads_source,
            "lds_config": ads_source,
        },
        "static_resources": {"clusters": clusters, "listeners": listeners},
    }
