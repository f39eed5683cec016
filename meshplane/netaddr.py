"""Parsing of ``HOST:PORT`` listen addresses, including ``[::1]:PORT``."""

from __future__ import annotations

import ipaddress


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
