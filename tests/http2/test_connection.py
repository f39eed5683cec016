"""The h2 backend's Connection fed raw bytes: the frames it answers and the events it emits.

Frames are built by hand (struct), request blocks with our own never-indexing
encoder (so a block is the same bytes in every case) or hpack.Encoder where the
dynamic table matters. Each table row is one rule of the module docstring.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field

import hpack
import pytest

from meshplane.servers.h2.http2.connection import (
    CANCEL,
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    INTERNAL_ERROR,
    NO_ERROR,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    Connection,
    ConnectionTerminated,
    DataReceived,
    Event,
    RequestReceived,
    StreamReset,
)
from meshplane.servers.h2.http2.hpack_blocks import RESPONSE_GRPC, TRAILERS_OK, encode_headers
from meshplane.servers.h2.http2.limits import DEFAULT_LIMITS, Limits, ResetBudget

ACK = 0x1
REQUEST = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":path", b"/pkg.Svc/Call"),
    (b":authority", b"backend"),
    (b"content-type", b"application/grpc"),
    (b"te", b"trailers"),
]
BLOCK = encode_headers(REQUEST)


def raw(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return struct.pack(">BHBBI", n >> 16, n & 0xFFFF, kind, flags, stream_id) + payload


def settings(*pairs: tuple[int, int]) -> bytes:
    return raw(SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in pairs))


def u32(value: int) -> bytes:
    return struct.pack(">I", value)


def request(stream_id: int, *, end: bool = False, block: bytes = BLOCK) -> bytes:
    return raw(HEADERS, END_HEADERS | (END_STREAM if end else 0), stream_id, block)


def data(stream_id: int, payload: bytes, *, end: bool = False) -> bytes:
    return raw(DATA, END_STREAM if end else 0, stream_id, payload)


def rst(stream_id: int, code: int = CANCEL) -> bytes:
    return raw(RST_STREAM, 0, stream_id, u32(code))


def window_update(stream_id: int, increment: int) -> bytes:
    return raw(WINDOW_UPDATE, 0, stream_id, u32(increment))


def ping(payload: bytes = b"12345678", flags: int = 0) -> bytes:
    return raw(PING, flags, 0, payload)


Frame = tuple[int, int, int, bytes]


def parse(wire: bytes) -> list[Frame]:
    frames: list[Frame] = []
    pos = 0
    while pos < len(wire):
        high, low, kind, flags, stream_id = struct.unpack_from(">BHBBI", wire, pos)
        length = (high << 16) | low
        frames.append((kind, flags, stream_id, wire[pos + 9 : pos + 9 + length]))
        pos += 9 + length
    assert pos == len(wire)
    return frames


@dataclass
class Peer:
    """A hand-driven client: bytes in, our frames and events out."""

    limits: Limits = field(default_factory=Limits)
    conn: Connection = field(init=False)
    events: list[Event] = field(default_factory=list)
    now: float = 0.0

    def __post_init__(self) -> None:
        self.conn = Connection(self.limits)

    def handshake(self, *pairs: tuple[int, int]) -> list[Frame]:
        self.send(PREFACE + settings(*pairs))
        return self.frames()

    def send(self, *chunks: bytes) -> list[Event]:
        got = self.conn.receive(b"".join(chunks), self.now)
        self.events += got
        return got

    def frames(self) -> list[Frame]:
        frames = parse(self.conn.data_to_send())
        for kind, _, _, payload in frames:  # what we send is always valid
            if kind == WINDOW_UPDATE:
                assert 0 < struct.unpack(">I", payload)[0] < 1 << 31
        return frames

    def goaway(self) -> int | None:
        codes = [struct.unpack(">II", p[:8])[1] for k, _, _, p in self.frames() if k == GOAWAY]
        assert len(codes) <= 1
        return codes[0] if codes else None


def resets(frames: list[Frame]) -> list[tuple[int, int]]:
    return [(s, struct.unpack(">I", p)[0]) for k, _, s, p in frames if k == RST_STREAM]


def goaways(frames: list[Frame]) -> list[tuple[int, int]]:
    return [struct.unpack(">II", p[:8]) for k, _, _, p in frames if k == GOAWAY]


# -- the handshake ---------------------------------------------------------------------


def test_our_preface_is_settings_then_the_connection_window() -> None:
    conn = Connection(Limits(max_concurrent_streams=7, connection_window=1 << 20))
    frames = parse(conn.data_to_send())
    assert [f[0] for f in frames] == [SETTINGS, WINDOW_UPDATE]
    payload = frames[0][3]
    advertised = dict(struct.unpack_from(">HI", payload, i) for i in range(0, len(payload), 6))
    assert advertised == {2: 0, 3: 7, 4: 1 << 20, 5: 16_384, 6: 16_384}
    assert frames[1][3] == u32((1 << 20) - 65_535)


def test_settings_are_acknowledged_and_the_preface_may_arrive_in_pieces() -> None:
    peer = Peer()
    peer.conn.data_to_send()
    wire = PREFACE + settings((4, 100_000))
    for i in range(len(wire)):  # one byte at a time
        assert peer.send(wire[i : i + 1]) == []
    assert peer.frames() == [(SETTINGS, ACK, 0, b"")]


def test_the_input_state_for_the_adapters_timeouts() -> None:
    peer = Peer()
    state = peer.conn
    assert (state.settled, state.buffered_bytes, state.awaiting_continuation) == (False, 0, False)
    peer.send(PREFACE[:10])
    assert (state.settled, state.buffered_bytes) == (False, 10)
    peer.send(PREFACE[10:] + settings()[:5])
    assert (state.settled, state.buffered_bytes) == (False, 5)
    peer.send(settings()[5:])
    assert (state.settled, state.buffered_bytes) == (True, 0)
    peer.send(raw(HEADERS, 0, 1, BLOCK[:4]), ping()[:3])
    assert (state.buffered_bytes, state.awaiting_continuation) == (3, True)
    peer.send(ping()[3:])  # a PING inside a header block: the connection ends
    assert state.terminated
    peer2 = Peer()
    peer2.handshake()
    peer2.send(raw(HEADERS, 0, 1, BLOCK[:4]))
    assert peer2.conn.awaiting_continuation
    peer2.send(raw(CONTINUATION, END_HEADERS, 1, BLOCK[4:]))
    assert not peer2.conn.awaiting_continuation
    assert peer2.events == [RequestReceived(1, REQUEST, False)]


# -- connection errors: (name, limits, frames after the handshake, GOAWAY code) ------------

ConnCase = tuple[str, Limits, list[bytes], int]
BIG_WINDOW = Limits(connection_window=1 << 24)
CONNECTION_ERRORS: list[ConnCase] = [
    (
        "frame over MAX_FRAME_SIZE (its header alone)",
        Limits(),
        [b"\x00\x40\x01" + bytes([DATA, 0]) + u32(1)],
        FRAME_SIZE_ERROR,
    ),
    (
        "PUSH_PROMISE from a client",
        Limits(),
        [raw(PUSH_PROMISE, END_HEADERS, 1, u32(2))],
        PROTOCOL_ERROR,
    ),
    ("SETTINGS on a stream", Limits(), [raw(SETTINGS, 0, 1)], PROTOCOL_ERROR),
    (
        "SETTINGS length not a multiple of 6",
        Limits(),
        [raw(SETTINGS, 0, 0, b"\0" * 5)],
        FRAME_SIZE_ERROR,
    ),
    ("SETTINGS ACK with a payload", Limits(), [raw(SETTINGS, ACK, 0, b"\0" * 6)], FRAME_SIZE_ERROR),
    (
        "more settings in one frame than max_settings_entries",
        Limits(),
        [settings(*[(0x99, 0)] * 33)],
        ENHANCE_YOUR_CALM,
    ),
    ("ENABLE_PUSH 2", Limits(), [settings((2, 2))], PROTOCOL_ERROR),
    ("INITIAL_WINDOW_SIZE 2^31", Limits(), [settings((4, 1 << 31))], FLOW_CONTROL_ERROR),
    ("MAX_FRAME_SIZE below 2^14", Limits(), [settings((5, 16_383))], PROTOCOL_ERROR),
    ("MAX_FRAME_SIZE 2^24", Limits(), [settings((5, 1 << 24))], PROTOCOL_ERROR),
    ("HEADERS on an even stream", Limits(), [request(2)], PROTOCOL_ERROR),
    ("HEADERS on stream 0", Limits(), [request(0)], PROTOCOL_ERROR),
    ("HEADERS on a lower, closed id", Limits(), [request(5), request(3)], STREAM_CLOSED),
    (
        "HEADERS reusing a closed stream",
        Limits(),
        [request(1, end=True), rst(1), request(1)],
        STREAM_CLOSED,
    ),
    (
        "HEADERS padding longer than the payload",
        Limits(),
        [raw(HEADERS, END_HEADERS | PADDED, 1, bytes([len(BLOCK) + 1]) + BLOCK)],
        PROTOCOL_ERROR,
    ),
    (
        "HEADERS priority without its 5 bytes",
        Limits(),
        [raw(HEADERS, END_HEADERS | PRIORITY_FLAG, 1, b"\0\0\0")],
        PROTOCOL_ERROR,
    ),
    (
        "HEADERS making a stream depend on itself",
        Limits(),
        [raw(HEADERS, END_HEADERS | PRIORITY_FLAG, 1, u32(1) + b"\x10" + BLOCK)],
        PROTOCOL_ERROR,
    ),
    (
        "CONTINUATION without HEADERS",
        Limits(),
        [raw(CONTINUATION, END_HEADERS, 1, BLOCK)],
        PROTOCOL_ERROR,
    ),
    (
        "HEADERS interrupted by PING",
        Limits(),
        [raw(HEADERS, 0, 1, BLOCK[:3]), ping()],
        PROTOCOL_ERROR,
    ),
    (
        "CONTINUATION on another stream",
        Limits(),
        [raw(HEADERS, 0, 1, BLOCK[:3]), raw(CONTINUATION, END_HEADERS, 3, BLOCK[3:])],
        PROTOCOL_ERROR,
    ),
    (
        "CONTINUATION flood (header block over its cap)",
        Limits(max_header_block_bytes=100),
        [raw(HEADERS, 0, 1, BLOCK[:3])] + [raw(CONTINUATION, 0, 1, b"\x00" * 40)] * 3,
        ENHANCE_YOUR_CALM,
    ),
    (
        "undecodable header block",
        Limits(),
        [request(1, block=b"\xff\xff\xff\xff\xff\x0f")],
        COMPRESSION_ERROR,
    ),
    ("header index out of the table", Limits(), [request(1, block=b"\xbf")], COMPRESSION_ERROR),
    (
        "header list over 4x the advertised size",
        Limits(max_header_list_bytes=100),
        [request(1, block=encode_headers([*REQUEST, (b"x", b"v" * 400)]))],
        COMPRESSION_ERROR,
    ),
    ("DATA on stream 0", Limits(), [data(0, b"x")], PROTOCOL_ERROR),
    ("DATA on an idle stream", Limits(), [data(1, b"x")], PROTOCOL_ERROR),
    (
        "DATA on a stream the peer reset",
        Limits(),
        [request(1), rst(1), data(1, b"x")],
        STREAM_CLOSED,
    ),
    (
        "DATA padding as long as the payload",
        Limits(),
        [request(1), raw(DATA, PADDED, 1, b"\x04abc")],
        PROTOCOL_ERROR,
    ),
    (
        "DATA beyond the connection window",
        Limits(max_frame_size=1 << 16, connection_window=65_535),
        [request(1), data(1, b"x" * 65_535), request(3), data(3, b"x")],
        FLOW_CONTROL_ERROR,
    ),
    (
        "DATA beyond the stream window",
        Limits(max_frame_size=1 << 17, connection_window=1 << 20, stream_window=65_535),
        [request(1), data(1, b"x" * 65_536)],
        FLOW_CONTROL_ERROR,
    ),
    (
        "empty DATA frames in a row",
        Limits(),
        [request(1), data(1, b""), data(1, b"")],
        ENHANCE_YOUR_CALM,
    ),
    (
        "empty CONTINUATIONs in a row",
        Limits(),
        [raw(HEADERS, 0, 1, BLOCK), raw(CONTINUATION, 0, 1), raw(CONTINUATION, 0, 1)],
        ENHANCE_YOUR_CALM,
    ),
    (
        "empty HEADERS frames in a row",
        Limits(),
        [raw(HEADERS, END_HEADERS, 1), raw(HEADERS, END_HEADERS, 3)],
        ENHANCE_YOUR_CALM,
    ),
    ("WINDOW_UPDATE of 0 on the connection", Limits(), [window_update(0, 0)], PROTOCOL_ERROR),
    (
        "WINDOW_UPDATE overflowing the connection window",
        Limits(),
        [window_update(0, (1 << 31) - 65_535)],
        FLOW_CONTROL_ERROR,
    ),
    (
        "WINDOW_UPDATE not 4 bytes",
        Limits(),
        [raw(WINDOW_UPDATE, 0, 0, b"\0\0\1")],
        FRAME_SIZE_ERROR,
    ),
    ("WINDOW_UPDATE on an idle stream", Limits(), [window_update(1, 1)], PROTOCOL_ERROR),
    (
        "WINDOW_UPDATE flood (5 allowed with nothing sent)",
        Limits(),
        [window_update(0, 1)] * 6,
        ENHANCE_YOUR_CALM,
    ),
    (
        "INITIAL_WINDOW_SIZE overflowing an open stream's window",
        Limits(),
        [request(1), window_update(1, (1 << 31) - 65_536), settings((4, 65_537))],
        FLOW_CONTROL_ERROR,
    ),
    ("PING not 8 bytes", Limits(), [ping(b"1234567")], FRAME_SIZE_ERROR),
    ("PING on a stream", Limits(), [raw(PING, 0, 1, b"12345678")], PROTOCOL_ERROR),
    (
        "RST_STREAM not 4 bytes",
        Limits(),
        [request(1), raw(RST_STREAM, 0, 1, b"\0\0\0")],
        FRAME_SIZE_ERROR,
    ),
    ("RST_STREAM on an idle stream", Limits(), [rst(1)], PROTOCOL_ERROR),
    ("RST_STREAM on stream 0", Limits(), [rst(0)], PROTOCOL_ERROR),
    ("RST_STREAM on an even (never pushed) stream", Limits(), [request(5), rst(2)], PROTOCOL_ERROR),
    (
        "WINDOW_UPDATE on an even stream",
        Limits(),
        [request(5), window_update(4, 1)],
        PROTOCOL_ERROR,
    ),
    ("DATA on an even stream", Limits(), [request(5), data(2, b"x")], PROTOCOL_ERROR),
    ("PRIORITY not 5 bytes", Limits(), [raw(PRIORITY, 0, 1, b"\0" * 4)], FRAME_SIZE_ERROR),
    ("PRIORITY on stream 0", Limits(), [raw(PRIORITY, 0, 0, b"\0" * 5)], PROTOCOL_ERROR),
    (
        "PRIORITY flood",
        Limits(max_priority_frames_per_stream=2),
        [raw(PRIORITY, 0, 1, u32(0) + b"\x10")] * 3,
        ENHANCE_YOUR_CALM,
    ),
    ("GOAWAY on a stream", Limits(), [raw(GOAWAY, 0, 1, b"\0" * 8)], PROTOCOL_ERROR),
    ("GOAWAY under 8 bytes", Limits(), [raw(GOAWAY, 0, 0, b"\0" * 7)], FRAME_SIZE_ERROR),
    (
        "PINGs queued past the control-frame budget",
        Limits(max_outbound_control_frames=10),
        [ping()] * 11,
        ENHANCE_YOUR_CALM,
    ),
    (
        "malformed requests past the control-frame budget",
        Limits(max_outbound_control_frames=3),
        [request(i, block=encode_headers(REQUEST[1:])) for i in (1, 3, 5, 7)],
        ENHANCE_YOUR_CALM,
    ),
    (
        "rapid reset past the burst",
        Limits(reset_budget=ResetBudget(per_second=1, burst=3)),
        [request(i) + rst(i) for i in (1, 3, 5, 7)],
        ENHANCE_YOUR_CALM,
    ),
    (
        "made-you-reset past the burst",
        Limits(reset_budget=ResetBudget(per_second=1, burst=2)),
        [request(i) + window_update(i, 0) for i in (1, 3, 5)],
        ENHANCE_YOUR_CALM,
    ),
]


@pytest.mark.parametrize(
    ("name", "limits", "frames", "code"), CONNECTION_ERRORS, ids=[c[0] for c in CONNECTION_ERRORS]
)
def test_connection_errors_send_goaway_with_their_code(
    name: str, limits: Limits, frames: list[bytes], code: int
) -> None:
    peer = Peer(limits)
    peer.handshake()
    events = peer.send(b"".join(frames))
    assert isinstance(events[-1], ConnectionTerminated)
    assert events[-1].code == code
    wire = peer.frames()
    assert wire[-1][0] == GOAWAY
    assert struct.unpack(">I", wire[-1][3][4:8])[0] == code
    # Nothing more is read, nothing more is sent.
    assert peer.conn.terminated
    assert peer.send(ping(), request(101)) == []
    assert peer.frames() == []
    assert peer.conn.active_streams == 0


@pytest.mark.parametrize(
    ("name", "wire", "code"),
    [
        ("not HTTP/2 at all", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", PROTOCOL_ERROR),
        ("a wrong preface, detected before it is complete", b"PRI * HTTP/1.1", PROTOCOL_ERROR),
        ("PING before SETTINGS", PREFACE + ping(), PROTOCOL_ERROR),
        ("HEADERS before SETTINGS", PREFACE + request(1), PROTOCOL_ERROR),
        ("SETTINGS ACK before SETTINGS", PREFACE + raw(SETTINGS, ACK, 0), PROTOCOL_ERROR),
    ],
)
def test_the_preface_then_settings_are_required(name: str, wire: bytes, code: int) -> None:
    peer = Peer()
    peer.conn.data_to_send()
    events = peer.send(wire)
    assert len(events) == 1 and isinstance(events[0], ConnectionTerminated)
    assert events[0].code == code
    assert goaways(peer.frames()) == [(0, code)]


# -- stream errors: the connection lives on --------------------------------------------

CL5 = encode_headers([*REQUEST, (b"content-length", b"5")])
StreamCase = tuple[str, Limits, list[bytes], list[tuple[int, int]], list[Event]]
STREAM_ERRORS: list[StreamCase] = [
    (
        "DATA after the peer's END_STREAM",
        Limits(),
        [request(1, end=True), data(1, b"x")],
        [(1, STREAM_CLOSED)],
        [RequestReceived(1, REQUEST, True), StreamReset(1, STREAM_CLOSED)],
    ),
    (
        "HEADERS after the peer's END_STREAM",
        Limits(),
        [request(1, end=True), request(1)],
        [(1, STREAM_CLOSED)],
        [RequestReceived(1, REQUEST, True), StreamReset(1, STREAM_CLOSED)],
    ),
    (
        "trailers without END_STREAM",
        Limits(),
        [request(1), request(1, block=encode_headers([(b"x-t", b"1")]))],
        [(1, PROTOCOL_ERROR)],
        [RequestReceived(1, REQUEST, False), StreamReset(1, PROTOCOL_ERROR)],
    ),
    (
        "trailers with a pseudo-header",
        Limits(),
        [request(1), request(1, end=True, block=encode_headers([(b":path", b"/")]))],
        [(1, PROTOCOL_ERROR)],
        [RequestReceived(1, REQUEST, False), StreamReset(1, PROTOCOL_ERROR)],
    ),
    (
        "WINDOW_UPDATE of 0 on a stream",
        Limits(),
        [request(1), window_update(1, 0)],
        [(1, PROTOCOL_ERROR)],
        [RequestReceived(1, REQUEST, False), StreamReset(1, PROTOCOL_ERROR)],
    ),
    (
        "WINDOW_UPDATE overflowing a stream window",
        Limits(),
        [request(1), window_update(1, (1 << 31) - 65_535)],
        [(1, FLOW_CONTROL_ERROR)],
        [RequestReceived(1, REQUEST, False), StreamReset(1, FLOW_CONTROL_ERROR)],
    ),
    (
        "PRIORITY making a stream depend on itself",
        Limits(),
        [request(1), raw(PRIORITY, 0, 1, u32(1) + b"\x10")],
        [(1, PROTOCOL_ERROR)],
        [RequestReceived(1, REQUEST, False), StreamReset(1, PROTOCOL_ERROR)],
    ),
    (
        "body over max_body_bytes",
        Limits(max_body_bytes=10),
        [request(1), data(1, b"x" * 6), data(1, b"x" * 5)],
        [(1, ENHANCE_YOUR_CALM)],
        [
            RequestReceived(1, REQUEST, False),
            DataReceived(1, b"x" * 6, False),
            StreamReset(1, ENHANCE_YOUR_CALM),
        ],
    ),
    (
        "bodies of the open streams together over max_connection_body_bytes",
        Limits(max_connection_body_bytes=10),
        [request(1), request(3), data(1, b"x" * 6), data(3, b"y" * 5)],
        [(3, ENHANCE_YOUR_CALM)],
        [
            RequestReceived(1, REQUEST, False),
            RequestReceived(3, REQUEST, False),
            DataReceived(1, b"x" * 6, False),
            StreamReset(3, ENHANCE_YOUR_CALM),
        ],
    ),
    (
        "body longer than content-length",
        Limits(),
        [request(1, block=CL5), data(1, b"123"), data(1, b"456")],
        [(1, PROTOCOL_ERROR)],
        [
            RequestReceived(1, [*REQUEST, (b"content-length", b"5")], False),
            DataReceived(1, b"123", False),
            StreamReset(1, PROTOCOL_ERROR),
        ],
    ),
    (
        "body shorter than content-length",
        Limits(),
        [request(1, block=CL5), data(1, b"1234", end=True)],
        [(1, PROTOCOL_ERROR)],
        [
            RequestReceived(1, [*REQUEST, (b"content-length", b"5")], False),
            StreamReset(1, PROTOCOL_ERROR),
        ],
    ),
    (
        "trailers before content-length is reached",
        Limits(),
        [
            request(1, block=CL5),
            data(1, b"1234"),
            request(1, end=True, block=encode_headers([(b"x-t", b"1")])),
        ],
        [(1, PROTOCOL_ERROR)],
        [
            RequestReceived(1, [*REQUEST, (b"content-length", b"5")], False),
            DataReceived(1, b"1234", False),
            StreamReset(1, PROTOCOL_ERROR),
        ],
    ),
    (
        "no body but a content-length",
        Limits(),
        [request(1, end=True, block=CL5)],
        [(1, PROTOCOL_ERROR)],
        [],
    ),
    (
        "header list over the advertised size",
        Limits(max_header_list_bytes=300),
        [request(1, block=encode_headers([*REQUEST, (b"x", b"v" * 200)]))],
        [(1, ENHANCE_YOUR_CALM)],
        [],
    ),
    (
        "streams over max_concurrent_streams",
        Limits(max_concurrent_streams=1),
        [request(1), request(3)],
        [(3, REFUSED_STREAM)],
        [RequestReceived(1, REQUEST, False)],
    ),
    (
        "new streams after the peer's GOAWAY",
        Limits(),
        [raw(GOAWAY, 0, 0, u32(0) + u32(NO_ERROR)), request(1)],
        [(1, REFUSED_STREAM)],
        [ConnectionTerminated(NO_ERROR, "peer sent GOAWAY (code 0)")],
    ),
]


@pytest.mark.parametrize(
    ("name", "limits", "frames", "expected_resets", "expected_events"),
    STREAM_ERRORS,
    ids=[c[0] for c in STREAM_ERRORS],
)
def test_stream_errors_reset_the_stream_and_the_connection_lives(
    name: str,
    limits: Limits,
    frames: list[bytes],
    expected_resets: list[tuple[int, int]],
    expected_events: list[Event],
) -> None:
    peer = Peer(limits)
    peer.handshake()
    events = peer.send(b"".join(frames))
    assert events == expected_events
    wire = peer.frames()
    assert resets(wire) == expected_resets
    assert goaways(wire) == []
    assert not peer.conn.terminated
    peer.send(ping(b"still-up"))
    assert peer.frames() == [(PING, ACK, 0, b"still-up")]


# -- request validation (RFC 9113 8.2, 8.3): a stream error, never a connection one -------


def without(name: bytes) -> list[tuple[bytes, bytes]]:
    return [h for h in REQUEST if h[0] != name]


MALFORMED: list[tuple[str, list[tuple[bytes, bytes]]]] = [
    ("uppercase name", [*REQUEST, (b"X-Upper", b"1")]),
    ("space in a name", [*REQUEST, (b"x y", b"1")]),
    ("colon inside a name", [*REQUEST, (b"x:y", b"1")]),
    ("empty name", [*REQUEST, (b"", b"1")]),
    ("non-ASCII name", [*REQUEST, (b"x\xc3\xa9", b"1")]),
    ("pseudo-header after a regular one", [*REQUEST, (b":authority", b"other")]),
    ("no :method", without(b":method")),
    ("no :scheme", without(b":scheme")),
    ("no :path", without(b":path")),
    ("empty :path", [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"")]),
    ("two :path", [(b":path", b"/a"), *REQUEST]),
    (":status in a request", [(b":status", b"200"), *REQUEST]),
    ("unknown pseudo-header", [(b":protocol", b"websocket"), *REQUEST]),
    ("CONNECT (no :scheme, no :path)", [(b":method", b"CONNECT"), (b":authority", b"h:1")]),
    ("connection", [*REQUEST, (b"connection", b"close")]),
    ("keep-alive", [*REQUEST, (b"keep-alive", b"5")]),
    ("proxy-connection", [*REQUEST, (b"proxy-connection", b"x")]),
    ("transfer-encoding", [*REQUEST, (b"transfer-encoding", b"chunked")]),
    ("upgrade", [*REQUEST, (b"upgrade", b"h2c")]),
    ("te other than trailers", [*without(b"te"), (b"te", b"gzip")]),
    ("CR in a value", [*REQUEST, (b"x", b"a\rb")]),
    ("LF in a value", [*REQUEST, (b"x", b"a\nb")]),
    ("NUL in a value", [*REQUEST, (b"x", b"a\x00b")]),
    ("leading space in a value", [*REQUEST, (b"x", b" a")]),
    ("trailing tab in a value", [*REQUEST, (b"x", b"a\t")]),
    ("content-length not a number", [*REQUEST, (b"content-length", b"5x")]),
    ("negative content-length", [*REQUEST, (b"content-length", b"-1")]),
    (
        "two different content-lengths",
        [*REQUEST, (b"content-length", b"1"), (b"content-length", b"2")],
    ),
]


@pytest.mark.parametrize(("name", "headers"), MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_requests_are_reset_with_protocol_error(
    name: str, headers: list[tuple[bytes, bytes]]
) -> None:
    peer = Peer()
    peer.handshake()
    block = encode_headers(headers)
    assert peer.send(request(1, block=block), data(1, b"ignored", end=True)) == []
    wire = peer.frames()
    assert resets(wire) == [(1, PROTOCOL_ERROR)]
    assert goaways(wire) == []
    # The DATA that followed on the reset stream was discarded, the connection goes on.
    assert peer.send(request(3, end=True)) == [RequestReceived(3, REQUEST, True)]


def test_a_body_matching_content_length_passes() -> None:
    peer = Peer()
    peer.handshake()
    headers = [*REQUEST, (b"content-length", b"5"), (b"content-length", b"5")]
    events = peer.send(
        request(1, block=encode_headers(headers)), data(1, b"12"), data(1, b"345", end=True)
    )
    assert events == [
        RequestReceived(1, headers, False),
        DataReceived(1, b"12", False),
        DataReceived(1, b"345", True),
    ]
    assert resets(peer.frames()) == []


def test_well_formed_requests_pass() -> None:
    peer = Peer()
    peer.handshake()
    odd = [
        (b":method", b"GET"),
        (b":scheme", b"https"),
        (b":path", b"/"),
        (b"x-empty", b""),
        (b"x-inner-space", b"a b\tc"),
        (b"x-latin", b"\xe9t\xe9"),
        (b"te", b"trailers"),
    ]
    events = peer.send(request(1, end=True, block=encode_headers(odd)))
    assert events == [RequestReceived(1, odd, True)]


# -- what is accepted ---------------------------------------------------------------------


def test_padding_priority_continuation_and_trailers_are_handled() -> None:
    peer = Peer()
    peer.handshake()
    padded = raw(
        HEADERS, PADDED | PRIORITY_FLAG, 1, b"\x04" + u32(0) + b"\x10" + BLOCK[:5] + b"\0" * 4
    )
    events = peer.send(
        padded,
        raw(CONTINUATION, 0, 1, BLOCK[5:9]),
        raw(CONTINUATION, END_HEADERS, 1, BLOCK[9:]),
        raw(DATA, PADDED, 1, b"\x02abc\0\0"),
        raw(PRIORITY, 0, 1, u32(0) + b"\x10"),  # PRIORITY is ignored (RFC 9113 5.3.2)
        raw(0xFA, 0x3, 1, b"unknown frame types are ignored"),
        raw(HEADERS, END_HEADERS | END_STREAM, 1, encode_headers([(b"x-trailer", b"1")])),
    )
    assert events == [
        RequestReceived(1, REQUEST, False),
        DataReceived(1, b"abc", False),
        DataReceived(1, b"", True),  # trailers are dropped: the body ends
    ]
    assert goaways(peer.frames()) == []


def test_ping_is_answered_with_its_payload_and_ping_acks_are_not() -> None:
    peer = Peer()
    peer.handshake()
    peer.send(ping(b"abcdefgh"), ping(b"ignored!", flags=ACK))
    assert peer.frames() == [(PING, ACK, 0, b"abcdefgh")]


def test_frames_on_a_stream_we_reset_are_ignored_and_their_credit_returns() -> None:
    peer = Peer(Limits(max_frame_size=1 << 16, connection_window=65_535))
    peer.handshake()
    peer.send(request(1))
    peer.conn.reset_stream(1, CANCEL)
    assert resets(peer.frames()) == [(1, CANCEL)]
    # The peer keeps sending on it, in flight: all ignored, the window never fills.
    for _ in range(4):
        assert peer.send(data(1, b"x" * 40_000), window_update(1, 5), rst(1)) == []
        assert goaways(peer.frames()) == []
    assert peer.send(request(3, end=True)) == [RequestReceived(3, REQUEST, True)]


def test_the_peers_goaway_lets_open_streams_finish() -> None:
    peer = Peer()
    peer.handshake()
    peer.send(request(1))
    events = peer.send(raw(GOAWAY, 0, 0, u32(0) + u32(NO_ERROR) + b"debug"))
    assert events == [ConnectionTerminated(NO_ERROR, "peer sent GOAWAY (code 0)")]
    assert peer.send(data(1, b"body", end=True)) == [DataReceived(1, b"body", True)]
    peer.conn.send_headers(1, TRAILERS_OK, end_stream=True)
    assert [f[0] for f in peer.frames()] == [HEADERS]
    assert peer.conn.active_streams == 0


def test_start_drain_ignores_new_streams_and_finishes_old_ones() -> None:
    peer = Peer()
    peer.handshake()
    peer.send(request(1), request(3))
    peer.conn.start_drain()
    assert goaways(peer.frames()) == [(3, NO_ERROR)]
    assert peer.send(request(5), data(5, b"x", end=True)) == []
    malformed = encode_headers(REQUEST[1:])
    assert peer.send(request(7, block=malformed), request(9, end=True, block=CL5)) == []
    assert peer.frames() == []  # ignored, not reset (RFC 9113 6.8)
    assert peer.send(data(1, b"a", end=True)) == [DataReceived(1, b"a", True)]
    assert peer.conn.active_streams == 2
    for stream_id in (1, 3):
        peer.conn.send_headers(stream_id, TRAILERS_OK, end_stream=True)
    peer.send(rst(3, CANCEL))
    assert peer.conn.active_streams == 0


def test_close_sends_goaway_and_stops_everything() -> None:
    peer = Peer()
    peer.handshake()
    peer.send(request(1))
    peer.conn.close(INTERNAL_ERROR, "shutting down")
    peer.conn.send_headers(1, RESPONSE_GRPC)
    assert goaways(peer.frames()) == [(1, INTERNAL_ERROR)]
    assert peer.conn.terminated and peer.conn.active_streams == 0
    assert peer.send(request(3)) == []


def test_an_answer_before_the_request_ends_closes_the_stream_when_it_does() -> None:
    """A gRPC server may answer (trailers-only) before the client's END_STREAM."""
    peer = Peer()
    peer.handshake()
    peer.send(request(1), request(3))
    peer.conn.send_headers(1, TRAILERS_OK, end_stream=True)
    peer.conn.send_data(3, b"early", end_stream=True)
    assert peer.conn.active_streams == 2
    assert peer.send(data(1, b"late", end=True)) == [DataReceived(1, b"late", True)]
    trailers = encode_headers([(b"x-t", b"1")])
    assert peer.send(request(3, end=True, block=trailers)) == [DataReceived(3, b"", True)]
    assert peer.conn.active_streams == 0
    assert goaways(peer.frames()) == []


def test_header_blocks_on_a_stream_we_reset_are_still_decoded() -> None:
    """HPACK state is per connection: an ignored block still updates the dynamic table."""
    peer = Peer()
    peer.handshake()
    encoder = hpack.Encoder()
    peer.send(request(1, block=encoder.encode(REQUEST)))
    peer.conn.reset_stream(1, CANCEL)
    trailers = [(b"x-trailer", b"indexed now")]
    peer.send(request(1, end=True, block=encoder.encode(trailers)))  # ignored, decoded
    again = [*REQUEST, *trailers]  # the encoder now refers to the entry by index
    assert peer.send(request(3, end=True, block=encoder.encode(again))) == [
        RequestReceived(3, again, True)
    ]


def test_the_memory_of_reset_streams_is_bounded() -> None:
    peer = Peer(Limits(max_concurrent_streams=1))  # remembers 2 x 1 + 64 = 66
    peer.handshake()
    for stream_id in range(1, 200, 2):
        peer.send(request(stream_id))
        peer.conn.reset_stream(stream_id, CANCEL)
    peer.frames()
    assert peer.send(data(199, b"in flight")) == []
    assert peer.send(data(199 - 2 * 65, b"in flight")) == []
    assert peer.goaway() is None
    assert peer.send(data(1, b"long forgotten")) == [
        ConnectionTerminated(STREAM_CLOSED, "DATA on a closed stream")
    ]


def test_sends_behind_a_queue_join_it_in_order() -> None:
    peer = Peer()
    peer.handshake((4, 5))
    peer.send(request(1, end=True))
    peer.conn.send_data(1, b"aaaaaaaaaa")
    peer.conn.send_data(1, b"bbb")
    peer.conn.send_data(1, b"cc", end_stream=True)
    peer.conn.send_data(1, b"after the end is ignored")
    assert peer.conn.queued_bytes == 10
    assert [f[3] for f in peer.frames()] == [b"aaaaa"]
    peer.send(window_update(1, 100))
    frames = peer.frames()
    assert [f[3] for f in frames] == [b"aaaaa", b"bbb", b"cc"]
    assert [f[1] for f in frames] == [0, 0, END_STREAM]
    assert peer.conn.active_streams == 0


# -- rapid reset: a token bucket on the time given ------------------------------------------


@pytest.mark.parametrize(
    ("name", "times", "survives"),
    [
        ("a burst of 5 at once", [0.0] * 5, True),
        ("6 at once", [0.0] * 6, False),
        ("6, one refilled after 0.1 s", [0.0] * 5 + [0.1], True),
        ("11 over 0.5 s (5 burst + 5 refilled)", [0.0] * 5 + [0.5] * 6, False),
        ("10 over 0.5 s", [0.0] * 5 + [0.5] * 5, True),
        ("the clock going back refills nothing", [1.0] * 5 + [0.0], False),
        ("steady at the rate, forever", [i * 0.1 for i in range(100)], True),
    ],
)
def test_rapid_reset_budget(name: str, times: list[float], survives: bool) -> None:
    peer = Peer(Limits(reset_budget=ResetBudget(per_second=10, burst=5)))
    peer.handshake()
    for i, now in enumerate(times):
        peer.now = now
        peer.send(request(2 * i + 1), rst(2 * i + 1))
    assert (peer.goaway() is None) == survives
    if not survives:
        assert peer.events[-1] == ConnectionTerminated(ENHANCE_YOUR_CALM, "too many streams reset")


def test_the_default_budget_cancels_every_open_stream_twice_at_once_not_more() -> None:
    """A client may cancel all its 128 open calls at once, twice; a rapid-reset peer
    that reconnects gets 256 streams a connection, not 1,000 (docs/runtime.md)."""
    peer = Peer(DEFAULT_LIMITS)
    peer.handshake()
    stream_id = 1
    for _ in range(2):
        opened = []
        for _ in range(DEFAULT_LIMITS.max_concurrent_streams):
            opened.append(request(stream_id))
            stream_id += 2
        peer.send(*opened)
        peer.send(*(rst(frame_id) for frame_id in range(stream_id - 256, stream_id, 2)))
        assert peer.goaway() is None
    peer.send(request(stream_id), rst(stream_id))
    assert peer.goaway() == ENHANCE_YOUR_CALM


def test_resets_after_our_answer_cost_nothing() -> None:
    peer = Peer(Limits(reset_budget=ResetBudget(per_second=1, burst=1)))
    peer.handshake()
    for stream_id in range(1, 40, 2):
        peer.send(request(stream_id, end=True))
        peer.conn.send_headers(stream_id, RESPONSE_GRPC)
        peer.send(rst(stream_id))
    assert peer.goaway() is None


# -- flow control, our receive side -------------------------------------------------------


def window_updates(frames: list[Frame]) -> dict[int, int]:
    got: dict[int, int] = {}
    for kind, _, stream_id, payload in frames:
        if kind == WINDOW_UPDATE:
            got[stream_id] = got.get(stream_id, 0) + struct.unpack(">I", payload)[0]
    return got


def test_credit_comes_back_through_acknowledge_only() -> None:
    limits = Limits(connection_window=1 << 17, stream_window=1 << 16)
    peer = Peer(limits)
    peer.handshake()
    peer.send(request(1))
    chunk = b"x" * 16_384
    peer.send(data(1, chunk), data(1, chunk))
    assert window_updates(peer.frames()) == {}  # nothing consumed yet
    peer.conn.acknowledge(1, 2 * 16_384)  # half the stream window: both credits go back
    assert window_updates(peer.frames()) == {1: 32_768}
    peer.send(data(1, chunk))
    peer.conn.acknowledge(1, 100_000)  # more than it holds: clamped
    assert window_updates(peer.frames()) == {}  # under half owed, and the peer has room
    peer.send(data(1, chunk), data(1, chunk), data(1, chunk))
    peer.conn.acknowledge(1, 3 * 16_384)
    assert window_updates(peer.frames()) == {0: 98_304, 1: 65_536}


def test_a_peer_never_waits_on_credit_we_owe() -> None:
    """The application holds most of the window: what it acknowledges then goes back at
    once, however little, so the peer is never stalled by credit we sit on."""
    limits = Limits(connection_window=65_535, stream_window=65_535)
    peer = Peer(limits)
    peer.handshake()
    peer.send(request(1))
    chunk = b"x" * 16_384
    peer.send(data(1, chunk), data(1, chunk), data(1, chunk))  # 16,383 left
    assert window_updates(peer.frames()) == {}
    peer.conn.acknowledge(1, 100)
    assert window_updates(peer.frames()) == {0: 100, 1: 100}
    peer.conn.acknowledge(1, 1 << 20)
    peer.conn.acknowledge(1, 1)  # nothing left to credit: no empty WINDOW_UPDATE
    assert window_updates(peer.frames()) == {0: 3 * 16_384 - 100, 1: 3 * 16_384 - 100}


def test_unacknowledged_bytes_return_when_their_stream_closes() -> None:
    limits = Limits(connection_window=65_535)
    peer = Peer(limits)
    peer.handshake()
    total = 0
    for stream_id in range(1, 21, 2):  # 10 requests of 16 KiB: 160 KiB through a 64 KiB window
        peer.send(request(stream_id), data(stream_id, b"x" * 16_384, end=True))
        total += 16_384
        peer.conn.send_headers(stream_id, TRAILERS_OK, end_stream=True)
        peer.frames()
    assert goaways(peer.frames()) == []
    assert len(peer.events) == 20


def test_the_connections_body_count_frees_as_streams_close_or_reset() -> None:
    """128 streams x 4 MiB held at once is what max_connection_body_bytes stops; the
    count is of *open* streams, so a client sending one big request after another, or
    one whose stream was reset, is never refused."""
    peer = Peer(Limits(max_connection_body_bytes=10))
    peer.handshake()
    for stream_id in range(1, 41, 2):  # 20 bodies of 8 bytes, one after another
        peer.send(request(stream_id), data(stream_id, b"x" * 8, end=True))
        peer.conn.send_headers(stream_id, TRAILERS_OK, end_stream=True)
    peer.send(request(41), data(41, b"x" * 8), rst(41))  # reset by the peer
    peer.send(request(43), data(43, b"x" * 8))
    peer.conn.reset_stream(43, CANCEL)  # reset by the application
    peer.send(request(45), data(45, b"x" * 10, end=True))  # exactly the cap
    assert resets(peer.frames()) == [(43, CANCEL)]
    assert peer.events[-2:] == [
        RequestReceived(45, REQUEST, False),
        DataReceived(45, b"x" * 10, True),
    ]


def test_discarded_and_padding_bytes_are_credited_without_acknowledge() -> None:
    peer = Peer(Limits(connection_window=65_535))
    peer.handshake()
    peer.send(request(1), request(3, end=True))
    pad = b"\xff" + b"x" + b"\0" * 255
    for _ in range(300):  # 77 KB of padding through a 64 KiB window
        peer.send(raw(DATA, PADDED, 1, pad))
        peer.send(data(3, b"y" * 100))  # after END_STREAM: reset, then discarded
        peer.frames()
    assert peer.goaway() is None


# -- the send side ----------------------------------------------------------------------


def test_send_data_honours_frame_size_and_windows_and_keeps_trailers_in_order() -> None:
    peer = Peer()
    peer.handshake()
    peer.send(request(1, end=True))
    body = bytes(range(256)) * 400  # 102,400 bytes against 65,535 of window
    peer.conn.send_headers(1, RESPONSE_GRPC)
    peer.conn.send_data(1, body)
    peer.conn.send_headers(1, TRAILERS_OK, end_stream=True)
    frames = peer.frames()
    assert [f[0] for f in frames] == [HEADERS, DATA, DATA, DATA, DATA]
    assert max(len(f[3]) for f in frames) == 16_384
    sent = b"".join(f[3] for f in frames if f[0] == DATA)
    assert len(sent) == 65_535
    assert peer.conn.queued_bytes == len(body) - 65_535 + len(TRAILERS_OK)
    assert peer.conn.active_streams == 1
    peer.send(window_update(0, 20_000))  # the connection opens, the stream does not
    assert peer.frames() == []
    peer.send(window_update(1, 20_000))
    frames = peer.frames()
    sent += b"".join(f[3] for f in frames if f[0] == DATA)
    assert len(sent) == 85_535
    peer.send(window_update(0, 50_000), window_update(1, 50_000))
    frames = peer.frames()
    sent += b"".join(f[3] for f in frames if f[0] == DATA)
    assert sent == body
    assert frames[-1] == (HEADERS, END_HEADERS | END_STREAM, 1, TRAILERS_OK)
    assert all(f[1] == 0 for f in frames[:-1])
    assert peer.conn.queued_bytes == 0 and peer.conn.active_streams == 0


def test_peer_settings_change_frame_size_and_windows_of_open_streams() -> None:
    peer = Peer()
    peer.handshake((4, 10), (5, 20_000))
    peer.send(request(1, end=True), request(3, end=True))
    for stream_id in (1, 3):
        peer.conn.send_data(stream_id, b"z" * 50_000, end_stream=True)
    frames = peer.frames()
    assert [(f[2], len(f[3])) for f in frames] == [(1, 10), (3, 10)]
    assert peer.conn.queued_bytes == 2 * 49_990
    peer.send(settings((4, 30_010)))  # +30,000 on every open stream (RFC 9113 6.9.2)
    frames = peer.frames()
    assert frames[0] == (SETTINGS, ACK, 0, b"")
    assert [(f[2], len(f[3])) for f in frames[1:]] == [
        (1, 20_000),
        (1, 10_000),
        (3, 20_000),
        (3, 10_000),
    ]
    peer.send(window_update(0, 1 << 20), settings((4, 60_000)))
    frames = peer.frames()
    total = sum(len(f[3]) for f in frames if f[0] == DATA)
    assert total == 2 * 19_990
    assert peer.conn.queued_bytes == 0 and peer.conn.active_streams == 0
    assert all(len(f[3]) <= 20_000 for f in frames)


def test_only_the_last_initial_window_size_of_a_frame_counts() -> None:
    peer = Peer()
    peer.handshake()
    peer.send(request(1, end=True))
    peer.conn.send_data(1, b"d" * 70_000)
    peer.frames()
    many = [(4, 1 << 30), (4, 0)] * 15 + [(4, 65_535 + 100), (0x99, 1)]
    peer.send(settings(*many))
    frames = peer.frames()
    assert frames[0] == (SETTINGS, ACK, 0, b"")
    assert sum(len(f[3]) for f in frames[1:]) == 0  # the connection window is spent
    peer.send(window_update(0, 1000))
    assert sum(len(f[3]) for f in peer.frames()) == 100  # the stream got +100 only


def test_a_negative_window_holds_data_until_it_is_positive_again() -> None:
    peer = Peer()
    peer.handshake()
    peer.send(request(1, end=True))
    peer.conn.send_data(1, b"a" * 1000)
    peer.send(settings((4, 500)))  # the stream window is now 500 - 1000 = -500
    peer.frames()
    peer.conn.send_data(1, b"b" * 10, end_stream=True)
    assert peer.frames() == []
    peer.send(window_update(1, 505))
    frames = peer.frames()
    assert [(f[0], f[1], f[3]) for f in frames] == [(DATA, 0, b"b" * 5)]
    peer.send(window_update(1, 5))
    assert [(f[0], f[1], f[3]) for f in peer.frames()] == [(DATA, END_STREAM, b"b" * 5)]


def test_a_reset_stream_drops_its_queue_and_later_sends_are_ignored() -> None:
    peer = Peer()
    peer.handshake()
    peer.send(request(1, end=True))
    peer.conn.send_data(1, b"x" * 100_000)
    assert peer.conn.queued_bytes == 100_000 - 65_535
    assert peer.send(rst(1, CANCEL)) == [StreamReset(1, CANCEL)]
    assert peer.conn.queued_bytes == 0 and peer.conn.active_streams == 0
    peer.frames()
    peer.conn.send_data(1, b"late")
    peer.conn.send_headers(1, TRAILERS_OK, end_stream=True)
    peer.conn.reset_stream(1, CANCEL)
    assert peer.frames() == []


def test_large_header_blocks_go_out_as_continuations() -> None:
    peer = Peer()
    peer.handshake()
    peer.send(request(1, end=True))
    block = encode_headers([(b":status", b"200"), (b"x-big", b"v" * 40_000)])
    peer.conn.send_headers(1, block, end_stream=True)
    frames = peer.frames()
    assert [(f[0], f[1]) for f in frames] == [
        (HEADERS, END_STREAM),
        (CONTINUATION, 0),
        (CONTINUATION, END_HEADERS),
    ]
    assert b"".join(f[3] for f in frames) == block
    assert list(hpack.Decoder().decode(block, raw=True))[1] == (b"x-big", b"v" * 40_000)


def test_a_peer_shrinking_its_table_gets_a_size_update_in_our_next_block() -> None:
    peer = Peer()
    peer.handshake((1, 0))
    peer.send(request(1), request(3))
    peer.conn.send_headers(1, RESPONSE_GRPC)
    peer.conn.send_headers(3, RESPONSE_GRPC)
    first, second = (f[3] for f in peer.frames())
    assert first == b"\x20" + RESPONSE_GRPC
    assert second == RESPONSE_GRPC


# -- the header-block cache -------------------------------------------------------------


def test_cache_hits_follow_the_dynamic_table() -> None:
    """Blocks from an indexing encoder (as Envoy's): every decoding is right, and blocks that
    left the table unchanged are answered from the cache."""
    peer = Peer()
    peer.handshake()
    encoder = hpack.Encoder()
    sent: list[list[tuple[bytes, bytes]]] = []
    for i in range(40):
        headers = [*REQUEST, (b"x-call", str(i % 3).encode())]
        if i % 7 == 0:
            headers.append((b"x-once", str(i).encode()))  # a new entry: the table changes
        sent.append(headers)
        peer.send(request(2 * i + 1, end=True, block=encoder.encode(headers)))
    got = [e.headers for e in peer.events if isinstance(e, RequestReceived)]
    assert got == sent
    assert peer.conn._cache  # the steady blocks were cached
    # A cached block gives the same list object (an adapter keys its own work on it).
    assert got[-1] is got[-4]
    assert sum(1 for i, headers in enumerate(got) if any(headers is g for g in got[:i])) >= 14


def test_cache_is_bounded_in_bytes() -> None:
    peer = Peer(Limits(header_cache_bytes=2_000))
    peer.handshake()
    for i in range(200):
        headers = [*REQUEST, (b"x-n", str(i).encode())]
        peer.send(request(2 * i + 1, end=True, block=encode_headers(headers)))
        assert peer.conn._cache_used <= 2_000
        assert peer.events[-1] == RequestReceived(2 * i + 1, headers, True)
        peer.conn.send_headers(2 * i + 1, TRAILERS_OK, end_stream=True)


# -- never raises -------------------------------------------------------------------------


def test_garbage_after_the_handshake_never_raises() -> None:
    rng = random.Random(7)
    kinds = [
        DATA,
        HEADERS,
        PRIORITY,
        RST_STREAM,
        SETTINGS,
        PUSH_PROMISE,
        PING,
        GOAWAY,
        WINDOW_UPDATE,
        CONTINUATION,
        0x0F,
    ]
    for _ in range(300):
        peer = Peer(Limits(max_concurrent_streams=4))
        peer.handshake()
        for _ in range(rng.randrange(1, 30)):
            payload = bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 4, 5, 8, 9, 20])))
            if rng.random() < 0.3:
                payload = BLOCK
            flags = rng.randrange(256)
            peer.now += rng.random()
            peer.send(raw(rng.choice(kinds), flags, rng.randrange(8), payload))
            if rng.random() < 0.2:
                for stream_id in range(1, 8, 2):
                    peer.conn.send_data(stream_id, b"r" * rng.randrange(70_000))
                    peer.conn.send_headers(stream_id, TRAILERS_OK, end_stream=rng.random() < 0.5)
            peer.frames()
            for event in peer.events:
                assert not (
                    isinstance(event, ConnectionTerminated) and event.code == INTERNAL_ERROR
                )
            if peer.conn.terminated:
                break


def client_traffic() -> bytes:
    """Valid client bytes: a few calls, with padding, CONTINUATION, PING, a reset."""
    encoder = hpack.Encoder()
    wire = [PREFACE, settings((4, 1 << 20)), window_update(0, 1 << 20)]
    for i in range(6):
        stream_id = 2 * i + 1
        block = encoder.encode([*REQUEST, (b"x-call", str(i).encode())])
        if i == 2:
            wire += [
                raw(HEADERS, 0, stream_id, block[:4]),
                raw(CONTINUATION, END_HEADERS, stream_id, block[4:]),
            ]
        else:
            wire.append(request(stream_id, block=block))
        wire.append(raw(DATA, PADDED, stream_id, b"\x03" + b"m" * 50 + b"\0\0\0"))
        wire.append(ping(bytes([i]) * 8))
        if i == 4:
            wire.append(rst(stream_id))
        else:
            wire.append(data(stream_id, b"n" * 2000, end=True))
    return b"".join(wire)


def test_any_split_of_the_input_gives_the_same_events() -> None:
    wire = client_traffic()
    whole = Peer()
    whole.conn.data_to_send()
    whole.send(wire)
    assert not whole.conn.terminated
    assert sum(isinstance(e, RequestReceived) for e in whole.events) == 6
    rng = random.Random(11)
    for _ in range(50):
        split = Peer()
        split.conn.data_to_send()
        pos = 0
        while pos < len(wire):
            step = rng.choice([1, 2, 9, 10, 100, 1000])
            split.send(wire[pos : pos + step])
            pos += step
        assert split.events == whole.events


def test_mutated_client_traffic_never_raises() -> None:
    wire = client_traffic()
    rng = random.Random(3)
    for _ in range(400):
        mutated = bytearray(wire)
        for _ in range(rng.randrange(1, 6)):
            pos = rng.randrange(len(PREFACE), len(mutated))
            action = rng.random()
            if action < 0.6:
                mutated[pos] = rng.randrange(256)
            elif action < 0.8:
                del mutated[pos : pos + rng.randrange(1, 12)]
            else:
                mutated[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 12)))
        peer = Peer()
        peer.conn.data_to_send()
        pos = 0
        while pos < len(mutated) and not peer.conn.terminated:
            step = rng.randrange(1, 3000)
            for event in peer.send(bytes(mutated[pos : pos + step])):
                if isinstance(event, DataReceived):
                    peer.conn.acknowledge(event.stream_id, len(event.data))
                    peer.conn.send_data(event.stream_id, b"answer" * 100, end_stream=event.ended)
            pos += step
            peer.frames()
        codes = [e.code for e in peer.events if isinstance(e, ConnectionTerminated)]
        assert INTERNAL_ERROR not in codes
