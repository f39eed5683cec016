"""Which address a request came from, behind trusted proxies (pure; table-tested).

The socket's peer is the client unless the peer is one of the configured
trusted proxies (``--trusted-proxies``: addresses and CIDRs, none by
default). Then the forwarding header those proxies append to is read: one
header, ``X-Forwarded-For`` by default (what Envoy, nginx and most load
balancers write) or RFC 7239 ``Forwarded`` (its ``for=`` parameters) with
``--forwarded-header forwarded``. The other header is ignored: a client can
send either, and only the one the proxy appends to ends with the truth.

The rule is the usual right-most-untrusted one: hops are walked from the
right (the one the peer added last) leftwards, trusted proxies are skipped,
and the first hop that is not a trusted proxy is the client. Everything left
of it was written by that client and proves nothing. If every hop is a
trusted proxy, the left-most one is the client.

Hostile or broken headers fall back to the peer (the proxy's own address),
never to a value the client could choose:

* a header larger than :data:`MAX_HEADER_BYTES` (all its lines together);
* a hop that the walk reaches and that is not an IP address (``unknown``,
  an obfuscated ``_name``, garbage, a ``Forwarded`` element that is not
  ``key=value`` pairs); hops left of the client are never parsed;
* more than :data:`MAX_HOPS` trusted hops in a row.

Addresses come out normalized (``::ffff:10.0.0.1`` is ``10.0.0.1``), so one
client is one throttle key however it is written.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from typing import Literal

ForwardedHeader = Literal["x-forwarded-for", "forwarded"]
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

#: All lines of one forwarding header together; above this the peer is used.
MAX_HEADER_BYTES = 8192
#: Trusted hops skipped at most before the walk gives up and uses the peer.
MAX_HOPS = 16


def parse_trusted_proxies(text: str) -> tuple[Network, ...]:
    """``"10.0.0.0/8, 192.168.1.7"`` as networks; ValueError names a bad entry.

    Entries are separated by commas or white space; an address is a /32 (or
    /128). Host bits set in a CIDR (``10.0.0.1/8``) are refused rather than
    silently widened or narrowed.
    """
    networks: list[Network] = []
    for entry in text.replace(",", " ").split():
        try:
            networks.append(ipaddress.ip_network(entry, strict=True))
        except ValueError as exc:
            raise ValueError(
                f"trusted proxy {entry!r} is not an IP address or CIDR: {exc}"
            ) from None
    return tuple(networks)


def _address(text: str) -> Address | None:
    """An IP address, with or without a port, IPv6 in brackets or not; None if not one."""
    text = text.strip()
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not (rest[0] == ":" and rest[1:].isdigit())):
            return None
        text = host
    elif text.count(":") == 1:  # IPv4 with a port
        host, _, port = text.partition(":")
        if not port.isdigit():
            return None
        text = host
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _trusted(address: Address, trusted: Sequence[Network]) -> bool:
    return any(address.version == net.version and address in net for net in trusted)


def _forwarded_for(element: str) -> str | None:
    """The ``for=`` value of one RFC 7239 element; None if the element is malformed.

    An element without ``for=`` stands for a hop whose address is unknown.
    """
    found = "unknown"
    for pair in element.split(";"):
        if not pair.strip():
            continue
        key, eq, raw = pair.partition("=")
        raw = raw.strip()
        if not eq or not key.strip() or not raw:
            return None
        if raw.startswith('"'):
            if len(raw) < 2 or not raw.endswith('"'):
                return None
            raw = raw[1:-1]
        if key.strip().lower() == "for":
            found = raw
    return found


def _walk(
    hops: list[str], read: Callable[[str], str | None], peer: Address, trusted: Sequence[Network]
) -> Address:
    """Right-most untrusted hop; the peer when the walk meets a malformed hop or runs long.

    Only the hops the walk reaches are parsed: what a client wrote left of
    its own address cannot make the answer fall back.
    """
    last = peer
    for skipped, hop in enumerate(reversed(hops)):
        if skipped >= MAX_HOPS:
            return peer
        text = read(hop)
        address = None if text is None else _address(text)
        if address is None:
            return peer
        if not _trusted(address, trusted):
            return address
        last = address
    return last


def client_address(
    peer: str,
    lines: Sequence[str],
    trusted: Sequence[Network],
    header: ForwardedHeader = "x-forwarded-for",
) -> str:
    """The client's address: ``peer``, or what trusted proxies say it is.

    ``lines`` are every line of ``header`` in the order received (a header
    sent twice counts as one list, RFC 9110).
    """
    peer_address = _address(peer)
    if peer_address is None:
        return peer  # a Unix socket, or no peer at all: nothing to trust
    if not trusted or not _trusted(peer_address, trusted) or not lines:
        return str(peer_address)
    value = ",".join(lines)
    if len(value) > MAX_HEADER_BYTES:
        return str(peer_address)
    read = _forwarded_for if header == "forwarded" else _xff_hop
    return str(_walk(value.split(","), read, peer_address, trusted))


def parse_forwarded_header(text: str) -> ForwardedHeader:
    """``--forwarded-header``: which header the trusted proxies append to."""
    name = text.strip().lower()
    if name == "x-forwarded-for":
        return "x-forwarded-for"
    if name == "forwarded":
        return "forwarded"
    raise ValueError(f"forwarded header {text!r} is neither 'x-forwarded-for' nor 'forwarded'")


def _xff_hop(element: str) -> str:
    return element
