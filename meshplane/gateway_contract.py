"""The gateway's contract with the management plane's ADS server, and its bootstrap.

A gateway Envoy of a cluster boots with a minimal bootstrap (:func:`bootstrap`)
and receives everything else (its listener, routes, the ext_authz and
rate-limit filters, the upstream clusters) over Envoy's Aggregated Discovery
Service from mgmt-api, on the same gRPC port as the policy stream. Both
sides agree, through this module, on:

- **who the gateway is** (:class:`GatewayNode`): ``node.cluster`` names the
  mesh cluster as ``ORGANIZATION/CLUSTER``; ``node.id`` is the instance (shown
  in the cluster's status); ``node.metadata`` carries what differs between
  gateways of one cluster: the listener address (:data:`LISTENER_KEY`), the
  gateway's name that HTTPRoutes' ``parentRefs`` and Gateway-targeted
  policies name (:data:`GATEWAY_NAME_KEY`), and where it reaches the
  rate-limit service (:data:`RATELIMIT_SERVICE_KEY`);
- **how it authenticates**: a bearer token in the ADS stream's
  ``initial_metadata``, an ES256 JWT signed with the cluster's agent key (the
  install template's credentials, as every subscriber's), with the
  :data:`XDS_AUDIENCE` audience. Envoy cannot mint tokens, so the one in the
  bootstrap lives :data:`GATEWAY_TOKEN_TTL_SECONDS` (the management plane
  accepts that lifetime for this audience only); it is checked when a
  stream opens and re-checked while it lives, so deleting the key ends every
  gateway stream that uses it within seconds. Re-render the bootstrap
  (``meshctl gateway bootstrap``) before it expires. The bootstrap file is a
  secret: write it mode 0600.

Nothing here imports a server package: meshctl, the demo and mgmt-api's
install template all render bootstraps with it.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import yaml

from meshplane.netaddr import SERVICE_URI_FORMS, parse_service_uri

#: The ``kind`` gateways show with in the cluster status, beside ratelimit and extauthz.
GATEWAY_KIND = "gateway"
#: ``aud`` of gateway tokens: refused on REST, on the policy stream and on the tunnel.
XDS_AUDIENCE = "meshplane:gateway-xds"
#: Lifetime of the token a bootstrap carries (Envoy presents it unchanged on every
#: reconnect): 30 days. Revoke by deleting the key; rotate by re-rendering.
GATEWAY_TOKEN_TTL_SECONDS = 30 * 24 * 3600
#: Static cluster, in the bootstrap, that reaches the ADS server.
XDS_CLUSTER = "meshplane_xds"
#: node.metadata keys.
LISTENER_KEY = "meshplane.listener"
GATEWAY_NAME_KEY = "meshplane.gateway"
RATELIMIT_SERVICE_KEY = "meshplane.ratelimitService"

# A gateway serves the network; its listener is set per gateway in the bootstrap.
DEFAULT_LISTEN_HOST = "0.0.0.0"
DEFAULT_LISTEN_PORT = 10000
DEFAULT_GATEWAY_NAME = "gateway"
DEFAULT_RATELIMIT_SERVICE = "grpc://ratelimit:8081"
DEFAULT_ADMIN = ("127.0.0.1", 9901)
_TYPE = "type.googleapis.com/"


class BootNode(Protocol):
    """What a bootstrap needs of a node: gateways and sidecars (meshplane.sidecar_contract)."""

    @property
    def instance(self) -> str: ...
    @property
    def node_cluster(self) -> str: ...
    def metadata(self) -> dict[str, Any]: ...


class NodeError(ValueError):
    """The node a gateway announced is not one the ADS server can serve."""


@dataclass(frozen=True)
class GatewayNode:
    """One gateway Envoy, as its bootstrap's ``node`` describes it."""

    organization: str
    cluster: str
    instance: str
    listen_host: str = DEFAULT_LISTEN_HOST
    listen_port: int = DEFAULT_LISTEN_PORT
    gateway_name: str = DEFAULT_GATEWAY_NAME
    ratelimit_service: str = DEFAULT_RATELIMIT_SERVICE

    @property
    def node_cluster(self) -> str:
        return f"{self.organization}/{self.cluster}"

    def metadata(self) -> dict[str, Any]:
        return {
            LISTENER_KEY: {"address": self.listen_host, "port": self.listen_port},
            GATEWAY_NAME_KEY: self.gateway_name,
            RATELIMIT_SERVICE_KEY: self.ratelimit_service,
        }


def _grpc_uri(value: str, what: str) -> tuple[str, int, bool]:
    """``grpc://host:port`` or ``grpcs://host:port`` as (host, port, tls)."""
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        port = None
        parts = urlsplit("")
    if parts.scheme not in ("grpc", "grpcs") or not parts.hostname or port is None:
        raise NodeError(f"{what} must be grpc://HOST:PORT or grpcs://HOST:PORT, not {value!r}")
    return parts.hostname, port, parts.scheme == "grpcs"


def grpc_address(value: str, what: str) -> tuple[str, int, bool]:
    """(host, port, tls) of a ``grpc://``/``grpcs://`` URL; :class:`NodeError` names ``what``.

    For whoever is handed an ADS address to check before rendering a
    bootstrap with it (mgmt-api's ``MESHPLANE_GRPC_PUBLIC_URL`` at start-up).
    """
    return _grpc_uri(value, what)


def parse_node(node_id: str, node_cluster: str, metadata: Mapping[str, Any]) -> GatewayNode:
    """The :class:`GatewayNode` of an Envoy ``Node`` (id, cluster, metadata as a dict)."""
    organization, sep, cluster = node_cluster.partition("/")
    if not sep or not organization or not cluster or "/" in cluster:
        raise NodeError(f"node.cluster must be ORGANIZATION/CLUSTER, not {node_cluster!r}")
    if not node_id:
        raise NodeError("node.id (the gateway instance) is required")
    listener = metadata.get(LISTENER_KEY, {})
    if not isinstance(listener, Mapping):
        raise NodeError(f"node.metadata[{LISTENER_KEY!r}] must be {{address, port}}")
    host = listener.get("address", DEFAULT_LISTEN_HOST)
    port = listener.get("port", DEFAULT_LISTEN_PORT)
    if isinstance(port, float) and port.is_integer():  # protobuf Struct numbers are doubles
        port = int(port)
    if not isinstance(host, str) or not isinstance(port, int) or not 0 < port < 65536:
        raise NodeError(f"node.metadata[{LISTENER_KEY!r}] needs an address and a port 1-65535")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise NodeError(f"the listener address must be an IP address, not {host!r}") from None
    name = metadata.get(GATEWAY_NAME_KEY, DEFAULT_GATEWAY_NAME)
    service = metadata.get(RATELIMIT_SERVICE_KEY, DEFAULT_RATELIMIT_SERVICE)
    if not isinstance(name, str) or not name:
        raise NodeError(f"node.metadata[{GATEWAY_NAME_KEY!r}] must be a name")
    if not isinstance(service, str):
        raise NodeError(f"node.metadata[{RATELIMIT_SERVICE_KEY!r}] must be {SERVICE_URI_FORMS}")
    try:
        parse_service_uri(service)
    except ValueError as exc:
        raise NodeError(f"node.metadata[{RATELIMIT_SERVICE_KEY!r}]: {exc}") from None
    return GatewayNode(organization, cluster, node_id, host, port, name, service)


def _socket_address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def xds_cluster(
    ads: str, *, ca_file: str | None, cert_file: str | None, key_file: str | None
) -> dict[str, Any]:
    """The bootstrap's static cluster reaching mgmt-api's gRPC port over HTTP/2.

    HTTP/2 keepalive pings find a dead management plane in ~40 s (a half-open
    connection otherwise looks alive until TCP gives up); ``grpcs://`` adds
    TLS checked against ``ca_file`` (required: the gateway must not take its
    configuration from whoever answers) and, for mutual TLS, a client
    certificate.
    """
    host, port, tls = _grpc_uri(ads, "the ADS address")
    try:
        ipaddress.ip_address(host)
        discovery = "STATIC"
    except ValueError:
        discovery = "STRICT_DNS"
    cluster: dict[str, Any] = {
        "name": XDS_CLUSTER,
        "type": discovery,
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": _TYPE + "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {
                    "http2_protocol_options": {
                        "connection_keepalive": {"interval": "30s", "timeout": "10s"}
                    }
                },
            }
        },
        "load_assignment": {
            "cluster_name": XDS_CLUSTER,
            "endpoints": [
                {"lb_endpoints": [{"endpoint": {"address": _socket_address(host, port)}}]}
            ],
        },
    }
    if tls:
        if not ca_file:
            raise NodeError(
                "a grpcs:// ADS address needs the CA file that signs mgmt-api's certificate"
            )
        common: dict[str, Any] = {
            # The CA alone would accept any certificate it signed: the name must
            # be mgmt-api's too (an IP address in an IP SAN, a name in a DNS SAN).
            "validation_context": {
                "trusted_ca": {"filename": ca_file},
                "match_typed_subject_alt_names": [
                    {
                        "san_type": "IP_ADDRESS" if discovery == "STATIC" else "DNS",
                        "matcher": {"exact": host},
                    }
                ],
            },
            "alpn_protocols": ["h2"],
        }
        if cert_file or key_file:
            if not (cert_file and key_file):
                raise NodeError("a client certificate needs both the certificate and the key file")
            common["tls_certificates"] = [
                {
                    "certificate_chain": {"filename": cert_file},
                    "private_key": {"filename": key_file},
                }
            ]
        cluster["transport_socket"] = {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": _TYPE + "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "sni": host,
                "common_tls_context": common,
            },
        }
    return cluster


def bootstrap(
    node: BootNode,
    *,
    ads: str,
    token: str,
    admin: tuple[str, int] = DEFAULT_ADMIN,
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
) -> dict[str, Any]:
    """A gateway's whole bootstrap (Envoy's YAML/JSON field names): node, admin, ADS.

    Listeners and clusters are dynamic (LDS and CDS over ADS; the listener's
    routes over RDS, so a policy change reaches open connections too). Envoy
    keeps serving the last configuration it received while mgmt-api is
    unreachable and reconnects by itself; a gateway that *starts* while
    mgmt-api is down has no listener until it connects (docs/gateway.md).
    """
    ads_source = {"ads": {}, "resource_api_version": "V3"}
    return {
        "node": {"id": node.instance, "cluster": node.node_cluster, "metadata": node.metadata()},
        "admin": {"address": _socket_address(*admin)},
        "dynamic_resources": {
            "ads_config": {
                "api_type": "GRPC",
                "transport_api_version": "V3",
                "set_node_on_first_message_only": True,
                "grpc_services": [
                    {
                        "envoy_grpc": {"cluster_name": XDS_CLUSTER},
                        "initial_metadata": [{"key": "authorization", "value": f"Bearer {token}"}],
                    }
                ],
            },
            "cds_config": ads_source,
            "lds_config": ads_source,
        },
        "static_resources": {
            "clusters": [xds_cluster(ads, ca_file=ca_file, cert_file=cert_file, key_file=key_file)]
        },
    }


def bootstrap_text(doc: Mapping[str, Any], fmt: str = "yaml") -> str:
    """A bootstrap as Envoy reads it: YAML (without anchors, which :func:`bootstrap`'s
    shared ``ads`` config source would otherwise get) or JSON."""
    plain = json.loads(json.dumps(doc))
    if fmt == "json":
        return json.dumps(plain, indent=2) + "\n"
    return str(yaml.safe_dump(plain, sort_keys=False))
