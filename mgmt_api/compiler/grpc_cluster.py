"""The Envoy cluster that reaches one gRPC server: the ext_authz and rate-limit
services of a gateway, and the tracing collector.

Its own module because both :mod:`mgmt_api.compiler.envoy_config` and
:mod:`mgmt_api.compiler.tracing` build one, and the first imports the second.
"""

from __future__ import annotations

from meshplane.netaddr import ServiceAddress, parse_service_uri
from mgmt_api.compiler.protojson import JsonDict

_HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def _endpoint_address(address: ServiceAddress) -> JsonDict:
    if address.path:
        return {"pipe": {"path": address.path}}
    return {"socketAddress": {"address": address.host, "portValue": address.port}}


def grpc_cluster(name: str, uri: str) -> JsonDict:
    """An ``envoy.config.cluster.v3.Cluster`` reaching a gRPC server over HTTP/2,
    on ``grpc://host:port`` or on a Unix socket (``unix:///path``, ``pipe``)."""
    address = parse_service_uri(uri)  # validated when stored: raises only on a bug
    return {
        "name": name,
        # A socket path needs no resolution (and STRICT_DNS takes no pipe).
        "type": "STATIC" if address.path else "STRICT_DNS",
        "connectTimeout": "0.250s",
        "typedExtensionProtocolOptions": {
            _HTTP_OPTIONS: {
                "@type": "type.googleapis.com/" + _HTTP_OPTIONS,
                "explicitHttpConfig": {"http2ProtocolOptions": {}},
            }
        },
        "loadAssignment": {
            "clusterName": name,
            "endpoints": [{"lbEndpoints": [{"endpoint": {"address": _endpoint_address(address)}}]}],
        },
    }
