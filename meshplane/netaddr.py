"""Parsing of listen addresses: ``HOST:PORT`` (including ``[::1]:PORT``) and ``unix:/PATH``."""

from __future__ import annotations

import ipaddress
from typing import NamedTuple
from urllib.parse import urlsplit


def parse_listen(listen: str) -> tuple[str, int]:
    """Split ``HOST:PORT``; an empty host means all interfaces.

    Raises ValueError with the offending text, for CLI messages.
    """
    host, sep, port_text = listen.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError(f"listen address {listen!r} is not HOST:PORT")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"listen address {listen!r} has a port outside 0-65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", port


#: The prefix of a Unix domain socket listen address (``unix:/run/x.sock``).
UNIX_PREFIX = "unix:"
# sun_path holds 108 bytes, its terminating NUL included.
_MAX_SOCKET_PATH_BYTES = 107


def unix_listen_path(listen: str) -> str | None:
    """The socket path of ``unix:/ABS/PATH`` (or ``unix:///ABS/PATH``); None for ``HOST:PORT``.

    Only absolute paths: a relative one would depend on each worker's
    working directory. Raises ValueError with the offending text.
    """
    if not listen.startswith(UNIX_PREFIX):
        return None
    path = listen.removeprefix(UNIX_PREFIX)
    if path.startswith("///"):
        path = path[2:]
    if not path.startswith("/") or path.startswith("//") or "\0" in path:
        raise ValueError(f"listen address {listen!r} is not unix:/ABSOLUTE/PATH")
    if len(path.encode()) > _MAX_SOCKET_PATH_BYTES:
        raise ValueError(
            f"listen address {listen!r}: a socket path is at most {_MAX_SOCKET_PATH_BYTES} bytes"
        )
    return path


def check_serve_listen(listen: str, workers: int) -> None:
    """A service's gRPC listen address: ``HOST:PORT``, or ``unix:/PATH`` with one worker.

    Workers share a TCP port with SO_REUSEPORT; a Unix socket has nothing of
    the kind (a second bind replaces the first socket's file, and the first
    worker would silently get no more connections), so a socket path is
    served by one worker: scale the UDS placement by gateway pods, each with
    its own services (docs/runtime.md). Raises ValueError for CLI messages.
    """
    if unix_listen_path(listen) is None:
        parse_listen(listen)
    elif workers != 1:
        raise ValueError(
            f"listen address {listen!r}: a Unix socket is served by one worker "
            f"(--workers 1), not {workers}; scale by gateway pods"
        )


class ServiceAddress(NamedTuple):
    """Where a gateway reaches ratelimit or extauthz: ``host:port``, or a socket ``path``."""

    host: str = ""
    port: int = 0
    path: str = ""

    @property
    def label(self) -> str:
        """``host:port`` or the socket path: unique per address, for names."""
        return self.path or format_listen(self.host, self.port)


SERVICE_URI_FORMS = "grpc://HOST:PORT or unix:///ABSOLUTE/PATH"


def parse_service_uri(uri: str) -> ServiceAddress:
    """``grpc://host:port`` or ``unix:///abs/path`` (the services in the gateway's pod).

    A cluster address and nothing more: no credentials, query or fragment,
    no path after a port. Raises ValueError naming the accepted forms.
    """
    try:
        parts = urlsplit(uri)
        port = parts.port
    except ValueError:
        raise ValueError(f"{uri!r} is not {SERVICE_URI_FORMS}") from None
    if parts.query or parts.fragment or parts.username is not None:
        raise ValueError(f"{uri!r} is not {SERVICE_URI_FORMS}")
    if parts.scheme == "unix" and not parts.netloc and parts.path.startswith("/"):
        path = unix_listen_path(f"{UNIX_PREFIX}{parts.path}")  # its checks (length...)
        if path is not None:
            return ServiceAddress(path=path)
    elif (
        parts.scheme == "grpc"
        and parts.hostname
        and port is not None
        and 0 < port < 65536
        and parts.path in ("", "/")
    ):
        return ServiceAddress(parts.hostname, port)
    raise ValueError(f"{uri!r} is not {SERVICE_URI_FORMS}")


def format_listen(host: str, port: int) -> str:
    """The inverse of :func:`parse_listen`, bracketing IPv6 literals."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback literals (``127.0.0.0/8``, ``::1``, bracketed or not).

    Decides where plaintext is tolerated: a listener or target on loopback
    keeps credentials on this machine, anything else may cross a network.
    """
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
