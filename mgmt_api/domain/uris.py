"""Service addresses the API accepts: ``grpc://host:port`` or ``unix:///abs/path``."""

from __future__ import annotations

from meshplane.netaddr import parse_service_uri
from mgmt_api.errors import invalid


def check_grpc_uri(field: str, uri: str) -> None:
    """``grpc://host:port``, or ``unix:///abs/path`` for services in the gateway's
    pod: Envoy's ext_authz and ratelimit filters need a cluster address,
    nothing more (no path after a port, query, credentials)."""
    try:
        parse_service_uri(uri)
    except ValueError as exc:
        raise invalid(field, str(exc)) from None
