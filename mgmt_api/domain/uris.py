"""Service addresses the API accepts: ``grpc://host:port``."""

from __future__ import annotations

from urllib.parse import urlsplit

from mgmt_api.errors import invalid


def check_grpc_uri(field: str, uri: str) -> None:
    """``grpc://host:port``: Envoy's ext_authz and ratelimit filters need a cluster
    address, nothing more (no path, query, credentials)."""
    try:
        parts = urlsplit(uri)
        port = parts.port
    except ValueError:
        port = None
        parts = urlsplit("")
    if (
        parts.scheme != "grpc"
        or not parts.hostname
        or port is None
        or not 0 < port < 65536
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or parts.username is not None
    ):
        raise invalid(field, f"{uri!r} is not grpc://host:port")
