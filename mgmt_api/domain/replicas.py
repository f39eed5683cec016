"""Pure rules shared by mgmt-api replicas: the hop's signature, job periods, reply frames.

A replica that has no tunnel to a cluster forwards a proxytools call to the
replica that holds it (:mod:`mgmt_api.service.replicas`). The hop is signed
with HMAC-SHA256, keyed by the secret every replica shares, over everything
that makes the request what it is: the method, the path, the SHA-256 of the
body, the id of the replica it is meant for, a timestamp and a random nonce
(:func:`signed_text`). So only a replica can ask another to use its tunnels,
and a signed request cannot be turned into another one:

- sent to another path, with another body or to another replica, it no
  longer verifies (the receiver checks the target is its own id);
- older or newer than :data:`MAX_SKEW_SECONDS`, it is refused;
- within that window, its nonce is remembered (:class:`NonceCache`) and a
  second use is refused, so a call is served at most once.

A header that is not exactly ``t=<digits>,n=<32 hex>,r=<replica id>,v1=<64 hex>`` (ASCII
only, at most :data:`MAX_HEADER_CHARS`) is malformed, which the receiver
answers as any other bad signature: 401. The clock is an argument everywhere.

The hop carries the agents' answers (config dumps, logs), so it goes over
HTTPS; plain HTTP only to this machine's loopback (:func:`plain_hop`).

Periodic jobs run once per period across replicas: a period is
``floor(now / interval)``, and the replica that first records (job, period)
runs it (:mod:`mgmt_api.store.replicas`).
"""

from __future__ import annotations

import enum
import hashlib
import heapq
import hmac
import math
import re
import struct
import urllib.parse
from dataclasses import dataclass

from meshplane.netaddr import is_loopback_host

MAX_SKEW_SECONDS = 30.0
SIGNATURE_HEADER = "x-meshplane-replica-signature"
#: The longest header read (``t=``, ``n=``, ``r=``, ``v1=`` at their longest is 186).
MAX_HEADER_CHARS = 256
#: Nonces remembered at most (each until its signature expires, about 30 s): ~1,000
#: forwarded calls a second, sustained; about 9 MiB when full.
MAX_NONCES = 32_768
_VERSION = "v1"
_HEADER = re.compile(
    r"t=([0-9]{1,12}),n=([0-9a-f]{32}),r=([0-9A-Za-z_-]{1,64}),v1=([0-9a-f]{64})", re.ASCII
)
# A forwarded reply frame: 4-byte big-endian length, then one serialized tunnel Reply.
_LENGTH = struct.Struct(">I")
MAX_FRAME_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class Hop:
    """The request a signature is for: its method, path and body."""

    method: str
    path: str
    body: bytes


@dataclass(frozen=True)
class Signature:
    """A parsed header: the time, the nonce and the replica it is meant for, and the MAC."""

    stamp: int
    nonce: str
    target: str
    mac: str


class Refusal(enum.StrEnum):
    """Why a forwarded request is refused (each answered 401; logged by name)."""

    MALFORMED = "malformed"
    BAD_MAC = "bad-mac"
    WRONG_TARGET = "wrong-target"
    STALE = "stale"
    REPLAYED = "replayed"
    CACHE_FULL = "replay-cache-full"


def signed_text(hop: Hop, stamp: int, nonce: str, target: str) -> bytes:
    """The bytes the MAC covers: one field a line, the body by its SHA-256.

    None of the fields holds a newline (a method token, the fixed route, the
    header's digits and hex), so no two requests share the text.
    """
    digest = hashlib.sha256(hop.body).hexdigest()
    fields = (_VERSION, hop.method.upper(), hop.path, target, str(stamp), nonce, digest)
    return "\n".join(fields).encode()


def _mac(secret: bytes, hop: Hop, stamp: int, nonce: str, target: str) -> str:
    text = signed_text(hop, stamp, nonce, target)
    return hmac.new(secret, text, hashlib.sha256).hexdigest()


def sign(secret: bytes, hop: Hop, *, target: str, now: float, nonce: str) -> str:
    """``t=<unix seconds>,n=<nonce>,r=<target>,v1=<hex HMAC-SHA256(secret, signed_text)>``.

    ``nonce`` is 32 random hex digits, new for each request (the caller draws it).
    """
    stamp = int(now)
    return f"t={stamp},n={nonce},r={target},{_VERSION}={_mac(secret, hop, stamp, nonce, target)}"


def parse(header: str | None) -> Signature | None:
    """The signature in ``header``, or None when it is not exactly the expected shape."""
    if header is None or len(header) > MAX_HEADER_CHARS:
        return None
    found = _HEADER.fullmatch(header)
    if found is None:
        return None
    stamp, nonce, target, mac = found.groups()
    return Signature(int(stamp), nonce, target, mac)


def verify(secret: bytes, header: str | None, hop: Hop, me: str, now: float) -> Signature | Refusal:
    """The signature when ``header`` signs ``hop`` for replica ``me`` at ``now``; else why not.

    The nonce is not looked at here (:meth:`NonceCache.admit` does): it is
    remembered only once everything else holds, so no one without the secret
    can fill the cache.
    """
    signature = parse(header)
    if signature is None:
        return Refusal.MALFORMED
    expected = _mac(secret, hop, signature.stamp, signature.nonce, signature.target)
    if not hmac.compare_digest(expected.encode(), signature.mac.encode()):
        return Refusal.BAD_MAC
    if not hmac.compare_digest(signature.target.encode(), me.encode()):
        return Refusal.WRONG_TARGET
    if abs(now - signature.stamp) > MAX_SKEW_SECONDS:
        return Refusal.STALE
    return signature


class NonceCache:
    """The nonces of signatures still within the window: a second use is refused.

    An entry lives until its signature's time is :data:`MAX_SKEW_SECONDS`
    behind the clock; after that the signature is refused as stale anyway.
    Bounded by ``capacity`` entries: when that many unexpired nonces are held,
    a new one is refused (a replay is never let through to make room). Not
    thread-safe: the receiver uses it from its event loop only.
    """

    def __init__(self, capacity: int = MAX_NONCES) -> None:
        self.capacity = capacity
        self._expiry: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self._expiry)

    def admit(self, signature: Signature, now: float) -> Refusal | None:
        """Remember the signature's nonce; a refusal when it was seen or no room is left."""
        self._expire(now)
        if signature.nonce in self._expiry:
            return Refusal.REPLAYED
        if len(self._expiry) >= self.capacity:
            return Refusal.CACHE_FULL
        expiry = signature.stamp + MAX_SKEW_SECONDS
        self._expiry[signature.nonce] = expiry
        heapq.heappush(self._heap, (expiry, signature.nonce))
        return None

    def _expire(self, now: float) -> None:
        while self._heap and self._heap[0][0] < now:
            _, nonce = heapq.heappop(self._heap)
            del self._expiry[nonce]


def plain_hop(address: str) -> bool:
    """Whether a replica address is plain HTTP off this machine (refused: the hop would
    carry the agents' answers in clear). ``https://``, or a loopback host, is not."""
    parts = urllib.parse.urlsplit(address)
    return parts.scheme.lower() != "https" and not is_loopback_host(parts.hostname or "")


def period_of(now: float, interval: float) -> int:
    """The number of the period ``now`` falls in (periods start at the epoch)."""
    return math.floor(now / interval)


def next_period_start(now: float, interval: float) -> float:
    """When the period after the one ``now`` falls in starts."""
    return (period_of(now, interval) + 1) * interval


def frame(payload: bytes) -> bytes:
    return _LENGTH.pack(len(payload)) + payload


class FrameReader:
    """Splits a byte stream into frames; a frame over the cap is an error, never buffered."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer.extend(data)
        frames: list[bytes] = []
        while len(self._buffer) >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(self._buffer)
            if length > MAX_FRAME_BYTES:
                raise ValueError(f"a forwarded frame of {length} bytes is over the cap")
            if len(self._buffer) < _LENGTH.size + length:
                break
            frames.append(bytes(self._buffer[_LENGTH.size : _LENGTH.size + length]))
            del self._buffer[: _LENGTH.size + length]
        return frames
