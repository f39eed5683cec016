"""The gRPC-over-HTTP/2 wire format, as pure functions (no I/O, table-tested).

The Envoy-based server hands our ASGI adapter an HTTP/2 request whose body is
a stream of length-prefixed messages (1 byte compressed flag, 4 bytes
big-endian length, the message) and expects the response in the same
framing with ``grpc-status`` in the trailers. grpcio does this in C; here it
is a few functions, and every rule grpcio applies to a unary request is
applied the same way (https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md):

- a message may arrive in any number of DATA frames (the body is buffered
  until complete);
- the compressed flag with ``grpc-encoding: gzip`` is decoded; any other
  encoding is UNIMPLEMENTED, as is a compressed message without an encoding
  (grpcio answers INTERNAL there; either is an error, never an answer);
- a message longer than the receive limit (4 MiB, grpcio's default) is
  RESOURCE_EXHAUSTED, also when it only grows past the limit once inflated;
- ``grpc-timeout`` is parsed into seconds (the adapter enforces it).
"""

from __future__ import annotations

import enum
import zlib
from dataclasses import dataclass
from urllib.parse import quote

#: grpcio's default ``grpc.max_receive_message_length``.
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024

PREFIX_BYTES = 5


class Code(enum.IntEnum):
    """The gRPC status codes (google.rpc.Code)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class RpcError(Exception):
    """A call that ends with a non-OK status; what handlers raise to say so.

    Transport-neutral: the grpcio adapter turns it into ``context.abort``,
    the ASGI adapter into trailers.
    """

    def __init__(self, code: Code, message: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def frame(message: bytes) -> bytes:
    """One uncompressed length-prefixed message."""
    return b"\x00" + len(message).to_bytes(4, "big") + message


@dataclass
class MessageReader:
    """Collects DATA chunks into whole messages, enforcing the size limit.

    ``feed`` returns the messages completed by a chunk (decoded), raising
    RpcError for what grpcio refuses. ``pending`` tells whether a partial
    message is buffered (a body that ends then is truncated: INTERNAL, as
    grpcio answers).
    """

    encoding: str | None = None
    max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    #: Set by the reader's user once the body has ended (streaming calls).
    closed: bool = False
    _buffer: bytearray | None = None

    def __post_init__(self) -> None:
        self._buffer = bytearray()

    @property
    def pending(self) -> bool:
        return bool(self._buffer)

    def feed(self, chunk: bytes) -> list[bytes]:
        buffer = self._buffer
        assert buffer is not None
        buffer += chunk
        messages: list[bytes] = []
        while len(buffer) >= PREFIX_BYTES:
            length = int.from_bytes(buffer[1:5], "big")
            if length > self.max_bytes:
                raise RpcError(
                    Code.RESOURCE_EXHAUSTED,
                    f"Received message larger than max ({length} vs. {self.max_bytes})",
                )
            end = PREFIX_BYTES + length
            if len(buffer) < end:
                break
            compressed = buffer[0]
            message = bytes(buffer[PREFIX_BYTES:end])
            del buffer[:end]
            messages.append(self._decode(compressed, message))
        return messages

    def _decode(self, compressed: int, message: bytes) -> bytes:
        if compressed == 0:
            return message
        if compressed != 1:
            raise RpcError(Code.INTERNAL, f"invalid compressed flag {compressed}")
        if self.encoding in (None, "identity"):
            raise RpcError(
                Code.UNIMPLEMENTED, "compressed message without a grpc-encoding it can decode"
            )
        if self.encoding != "gzip":
            raise RpcError(Code.UNIMPLEMENTED, f"grpc-encoding {self.encoding!r} not supported")
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        try:
            # Bounded: a small message must not inflate into gigabytes.
            out = inflater.decompress(message, self.max_bytes + 1)
        except zlib.error as exc:
            raise RpcError(Code.INTERNAL, f"cannot decompress the message ({exc})") from None
        if len(out) > self.max_bytes or inflater.unconsumed_tail:
            raise RpcError(
                Code.RESOURCE_EXHAUSTED,
                f"Received message larger than max (over {self.max_bytes} once decompressed)",
            )
        return out


_TIMEOUT_UNITS = {
    "H": 3600.0,
    "M": 60.0,
    "S": 1.0,
    "m": 1e-3,
    "u": 1e-6,
    "n": 1e-9,
}


def parse_timeout(value: str) -> float | None:
    """``grpc-timeout`` in seconds (``TimeoutValue TimeoutUnit``), None if malformed."""
    if not 2 <= len(value) <= 9 or not value[:-1].isdigit():
        return None
    unit = _TIMEOUT_UNITS.get(value[-1])
    if unit is None:
        return None
    return int(value[:-1]) * unit


def encode_message(message: str) -> str:
    """``grpc-message``: printable ASCII but ``%`` as is, the rest percent-encoded UTF-8."""
    return "".join(
        char if " " <= char <= "~" and char != "%" else quote(char, safe="") for char in message
    )


def status_headers(code: Code, message: str = "") -> list[tuple[bytes, bytes]]:
    """The ``grpc-status`` (and ``grpc-message``) header pairs of a status."""
    pairs = [(b"grpc-status", str(int(code)).encode())]
    if message:
        pairs.append((b"grpc-message", encode_message(message).encode()))
    return pairs


def is_grpc_content_type(value: str) -> bool:
    """``application/grpc`` or ``application/grpc+...``/``;...`` (grpcio's rule)."""
    value = value.lower()
    return value == "application/grpc" or value.startswith(
        ("application/grpc+", "application/grpc;")
    )
