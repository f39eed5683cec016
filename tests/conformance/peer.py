"""A raw HTTP/2 peer for the conformance tables: frames written by hand, the answer read back.

The ``h2`` library checks what its user sends, so it cannot send what a
server must refuse (a stream id going back, a window overflow, a frame of the
wrong size). Here frames are built byte by byte (:func:`frame`) and headers
encoded with ``hpack`` (the ``h2`` library's own encoder), and what the server
answers is read with ``hyperframe`` and reduced to a :class:`Verdict`: the
class RFC 9113 gives it (a connection error, a stream error, an answer).
"""

from __future__ import annotations

import select
import socket
import struct
import time
from dataclasses import dataclass, field

import hpack
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SERVICE = "meshplane.test.Echo"

# Frame types and flags (RFC 9113 section 6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20

#: Error codes by name (RFC 9113 section 7).
ERRORS = {
    0x0: "NO_ERROR", 0x1: "PROTOCOL_ERROR", 0x2: "INTERNAL_ERROR", 0x3: "FLOW_CONTROL_ERROR",
    0x4: "SETTINGS_TIMEOUT", 0x5: "STREAM_CLOSED", 0x6: "FRAME_SIZE_ERROR",
    0x7: "REFUSED_STREAM", 0x8: "CANCEL", 0x9: "COMPRESSION_ERROR", 0xA: "CONNECT_ERROR",
    0xB: "ENHANCE_YOUR_CALM", 0xC: "INADEQUATE_SECURITY", 0xD: "HTTP_1_1_REQUIRED",
}  # fmt: skip


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One frame, exactly as given (no check of any rule)."""
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream_id)
        + payload
    )


def settings(*pairs: tuple[int, int], ack: bool = False) -> bytes:
    return frame(
        SETTINGS, ACK if ack else 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in pairs)
    )


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">I", increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, struct.pack(">I", code))


def grpc_message(message: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(message)) + message


def request_headers(
    method: str = "Echo", extra: tuple[tuple[str, str], ...] = ()
) -> list[tuple[str, str]]:
    return [(":method", "POST"), (":scheme", "http"), (":path", f"/{SERVICE}/{method}"),
            (":authority", "localhost"), ("content-type", "application/grpc"),
            ("te", "trailers"), *extra]  # fmt: skip


#: The first probe call's stream (see :meth:`Peer.verdict`): above any a scenario uses.
PROBE_STREAM = 1001
#: How long an answer on the watched stream may trail the probe's.
PROBE_GRACE = 0.5


def literal_block(headers: list[tuple[str, str]]) -> bytes:
    """An HPACK block of literals without indexing, new names, no Huffman (RFC 7541
    6.2.2): it reads the same whatever either side's dynamic table holds, and
    costs nothing to make however long a value is."""

    def string(text: str) -> bytes:
        raw = text.encode()
        return _integer(len(raw), 7) + raw

    return b"".join(b"\x00" + string(name) + string(value) for name, value in headers)


def _integer(value: int, prefix: int) -> bytes:
    """RFC 7541 5.1's integer, the first byte's other bits zero."""
    limit = (1 << prefix) - 1
    if value < limit:
        return bytes([value])
    out = [limit]
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def probe_call(stream_id: int) -> bytes:
    """A well-behaved Echo call whose header block is :func:`literal_block`."""
    return frame(HEADERS, END_HEADERS, stream_id, literal_block(request_headers())) + frame(
        DATA, END_STREAM, stream_id, grpc_message(b"probe")
    )


@dataclass
class Verdict:
    """What the server made of a sequence: RFC 9113's classes.

    ``kind`` is ``connection`` (GOAWAY with an error, or the socket closed
    without one), ``stream`` (RST_STREAM on the stream watched) or ``answer``
    (a response on it: ``status`` is its grpc-status, or ``http <code>`` when
    it is not gRPC); ``code`` the error's name. ``silent``: the server let the
    frames pass (the probe after them was answered, see :meth:`Peer.verdict`);
    ``hung``: nothing at all came back in time.
    """

    kind: str
    code: str = ""
    status: str = ""
    frames: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return " ".join(part for part in (self.kind, self.code, self.status) if part)


class Peer:
    """One connection to a server: send raw bytes, read frames into a verdict."""

    def __init__(self, port: int, *, client_settings: bytes | None = None, timeout: float = 10):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.timeout = timeout
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.decoder.max_header_list_size = 1 << 20
        self.buffer = b""
        self.frames: list[Frame] = []
        self.goaway: GoAwayFrame | None = None
        self.closed = False
        self._mark = 0  # frames before this index are not classified (see mark)
        self._probe_answered_at: float | None = None
        self._next_probe = PROBE_STREAM
        self.probe = 0  # the last probe's stream
        self.sock.sendall(PREFACE + (settings() if client_settings is None else client_settings))
        # The server's SETTINGS first, as most clients wait for: what follows is
        # then read by a server that is past its handshake.
        deadline = time.monotonic() + timeout
        while not any(isinstance(f, SettingsFrame) for f in self.frames):
            if time.monotonic() >= deadline or not self._read(deadline):
                raise ConnectionError(f"no SETTINGS from the server on {port}")

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, data: bytes) -> None:
        """Bytes to the server, reading what it answers meanwhile (a server that ends
        the connection halfway through a long write may reset the socket, and a
        reset drops what was not read yet: its GOAWAY). A server that already
        closed is no error here (the verdict says so)."""
        for start in range(0, len(data), 16384):
            if self.closed:
                return
            try:
                self.sock.sendall(data[start : start + 16384])
            except OSError:
                self.closed = True
                return
            if len(data) > 16384:
                self._read(time.monotonic())

    def block(self, headers: list[tuple[str, str]]) -> bytes:
        """An HPACK block of ``headers`` on this connection's encoder."""
        return bytes(self.encoder.encode(headers))

    def headers(self, stream_id: int, headers: list[tuple[str, str]], *, end: bool) -> bytes:
        flags = END_HEADERS | (END_STREAM if end else 0)
        return frame(HEADERS, flags, stream_id, self.block(headers))

    def call(self, stream_id: int, message: bytes = b"hi") -> bytes:
        """A well-behaved unary Echo call on ``stream_id``."""
        return self.headers(stream_id, request_headers(), end=False) + frame(
            DATA, END_STREAM, stream_id, grpc_message(message)
        )

    # ---- reading ---------------------------------------------------------------------

    def _read(self, deadline: float) -> bool:
        """Frames from what arrives before ``deadline``; False once the socket is done."""
        wait = max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([self.sock], [], [], wait)
        if not ready:
            return True
        try:
            chunk = self.sock.recv(1 << 16)
        except OSError:
            chunk = b""
        if not chunk:
            self.closed = True
            return False
        self.buffer += chunk
        while len(self.buffer) >= 9:
            header, length = Frame.parse_frame_header(memoryview(self.buffer[:9]))
            if len(self.buffer) < 9 + length:
                break
            header.parse_body(memoryview(self.buffer[9 : 9 + length]))
            self.buffer = self.buffer[9 + length :]
            self._took(header)
        return True

    def _took(self, received: Frame) -> None:
        self.frames.append(received)
        if isinstance(received, SettingsFrame) and "ACK" not in received.flags:
            self.send(settings(ack=True))
        elif isinstance(received, GoAwayFrame):
            self.goaway = received

    def _decoded(self, stream_id: int) -> list[dict[str, str]]:
        """The header blocks the server sent on ``stream_id``, decoded in order (the
        decoder is fed every block of the connection, as HPACK requires)."""
        blocks: list[tuple[int, bytes]] = []
        pending: tuple[int, bytes] | None = None
        for received in self.frames:
            if isinstance(received, HeadersFrame):
                pending = (received.stream_id, bytes(received.data))
            elif isinstance(received, ContinuationFrame) and pending is not None:
                pending = (pending[0], pending[1] + bytes(received.data))
            else:
                continue
            if "END_HEADERS" in received.flags:
                blocks.append(pending)
                pending = None
        decoder = hpack.Decoder()
        decoder.max_header_list_size = 1 << 20
        out = []
        for sid, block in blocks:
            decoded = {
                (k.decode() if isinstance(k, bytes) else k): (
                    v.decode() if isinstance(v, bytes) else v
                )
                for k, v in decoder.decode(block)
            }
            if sid == stream_id:
                out.append(decoded)
        return out

    def mark(self) -> None:
        """What came so far is done with: the next verdict is about what follows
        (a frame sent on a stream after its answer)."""
        self._mark = len(self.frames)

    def _stream_over(self, stream_id: int) -> bool:
        return any(
            f.stream_id == stream_id
            and (isinstance(f, RstStreamFrame) or "END_STREAM" in getattr(f, "flags", ()))
            for f in self.frames[self._mark :]
        )

    def verdict(self, stream_id: int, wait: float | None = None, *, probe: bool = True) -> Verdict:
        """Read until the server ends ``stream_id`` or the connection, and classify
        what it did.

        A probe call follows on a stream of its own (its header block literal, so
        it does not depend on what the server's HPACK table made of what came
        before): a server processes frames in order, so once the probe is
        answered and ``stream_id`` is not, the server has let the frames pass
        (``silent``), without waiting out a timeout.
        """
        if probe:
            self.probe = self._next_probe
            self._next_probe += 2
            self._probe_answered_at = None
            self.send(probe_call(self.probe))
        else:
            self.probe = 0
        deadline = time.monotonic() + (self.timeout if wait is None else wait)
        while not (self.goaway is not None or self.closed or self._stream_over(stream_id)):
            if (
                self.probe
                and self._stream_over(self.probe)
                and (time.monotonic() >= self._probe_grace(deadline))
            ):
                break
            if time.monotonic() >= deadline or not self._read(
                min(deadline, time.monotonic() + 0.05)
            ):
                break
        return self.classify(stream_id)

    def settle(self, wait: float | None = None) -> str:
        """After a sequence: ``served`` (the connection still answers a probe call),
        ``ended <code>`` (GOAWAY with an error, or ``closed`` without one), or
        ``hung`` (neither within ``wait``: the failure a fuzzer looks for).

        The probe gets a window of its own (a sequence may have set the initial
        window to 0), so its answer can always come.
        """
        self.probe = probe = self._next_probe
        self._next_probe += 2
        self.send(probe_call(probe) + window_update(probe, 65535))
        deadline = time.monotonic() + (self.timeout if wait is None else wait)
        while not (self.goaway is not None or self.closed or self._stream_over(probe)):
            if time.monotonic() >= deadline or not self._read(deadline):
                break
        if self.goaway is not None and self.goaway.error_code != 0:
            return f"ended {ERRORS.get(self.goaway.error_code, self.goaway.error_code)}"
        if self._stream_over(probe):
            return "served"
        if self.closed or self.goaway is not None:
            return "ended closed"
        return "hung"

    def unstick(self, wait: float | None = None) -> str:
        """After ``hung``: a server may rightly wait for the rest of a frame whose
        length a mutated sequence overstated (the probe's bytes taken as part of
        it). Zeros as long as the largest frame complete it, then read as empty
        DATA frames on stream 0, a connection error: a server that waited only
        for bytes ends the connection now; one that is stuck stays ``hung``."""
        self.send(b"\0" * (9 + 16384 + 9))
        deadline = time.monotonic() + (self.timeout if wait is None else wait)
        while not (self.goaway is not None or self.closed or self._stream_over(self.probe)):
            if time.monotonic() >= deadline or not self._read(deadline):
                break
        if self.goaway is not None and self.goaway.error_code != 0:
            return f"ended {ERRORS.get(self.goaway.error_code, self.goaway.error_code)}"
        if self._stream_over(self.probe):
            return "served"
        if self.closed or self.goaway is not None:
            return "ended closed"
        return "hung"

    def _probe_grace(self, deadline: float) -> float:
        """The probe is answered: a stream error or an answer on the watched stream
        would have come before it, but its answer may trail the probe's by a loop
        turn of the app (a few milliseconds; Envoy hands each stream to pyvoy)."""
        if self._probe_answered_at is None:
            self._probe_answered_at = time.monotonic()
        return min(deadline, self._probe_answered_at + PROBE_GRACE)

    def classify(self, stream_id: int) -> Verdict:
        seen = [_describe(f) for f in self.frames]
        for received in self.frames[self._mark :]:
            if isinstance(received, RstStreamFrame) and received.stream_id == stream_id:
                return Verdict("stream", ERRORS.get(received.error_code, "?"), frames=seen)
        if self._stream_over(stream_id):
            blocks = self._decoded(stream_id)
            merged = {k: v for block in blocks for k, v in block.items()}
            status = merged.get("grpc-status")
            if merged.get(":status") != "200" or status is None:
                return Verdict("answer", status=f"http {merged.get(':status')}", frames=seen)
            return Verdict("answer", status=status, frames=seen)
        if self.goaway is not None and self.goaway.error_code != 0:
            return Verdict("connection", ERRORS.get(self.goaway.error_code, "?"), frames=seen)
        if self.goaway is not None:
            return Verdict("goaway", "NO_ERROR", frames=seen)
        if self.closed:
            return Verdict("connection", "closed", frames=seen)
        if self.probe and self._stream_over(self.probe):
            return Verdict("silent", frames=seen)
        return Verdict("hung", frames=seen)

    def ping_ack(self, payload: bytes) -> bool:
        return any(
            isinstance(f, PingFrame) and "ACK" in f.flags and bytes(f.opaque_data) == payload
            for f in self.frames
        )

    def data_of(self, stream_id: int) -> bytes:
        return b"".join(
            bytes(f.data)
            for f in self.frames
            if isinstance(f, DataFrame) and f.stream_id == stream_id
        )


def _describe(received: Frame) -> str:
    name = type(received).__name__.removesuffix("Frame")
    extra = ""
    if isinstance(received, (GoAwayFrame, RstStreamFrame)):
        extra = f" {ERRORS.get(received.error_code, received.error_code)}"
    return f"{name}({received.stream_id}){extra}"
