"""Pure rules shared by mgmt-api replicas: the hop's signature, job periods, reply frames.

A replica that has no tunnel to a cluster forwards a proxytools call to the
replica that holds it (:mod:`mgmt_api.service.replicas`). The hop is signed
with HMAC-SHA256 over a timestamp and the body, keyed by the secret every
replica shares, so only a replica can ask another to use its tunnels; a
signature older (or newer) than :data:`MAX_SKEW_SECONDS` is refused, which
bounds a replay. The clock is an argument everywhere.

Periodic jobs run once per period across replicas: a period is
``floor(now / interval)``, and the replica that first records (job, period)
runs it (:mod:`mgmt_api.store.replicas`).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import struct

MAX_SKEW_SECONDS = 30.0
SIGNATURE_HEADER = "x-meshplane-replica-signature"
# A forwarded reply frame: 4-byte big-endian length, then one serialized tunnel Reply.
_LENGTH = struct.Struct(">I")
MAX_FRAME_BYTES = 8 * 1024 * 1024


def sign(secret: bytes, now: float, body: bytes) -> str:
    """``t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>``."""
    stamp = str(int(now))
    mac = hmac.new(secret, stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"t={stamp},v1={mac}"


def verify(secret: bytes, header: str | None, body: bytes, now: float) -> bool:
    """True only for a well-formed, fresh signature of ``body`` by ``secret``."""
    if not header or len(header) > 200:
        return False
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    stamp, mac = fields.get("t", ""), fields.get("v1", "")
    if not stamp.isdigit() or abs(now - int(stamp)) > MAX_SKEW_SECONDS:
        return False
    expected = hmac.new(secret, stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, mac)


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
