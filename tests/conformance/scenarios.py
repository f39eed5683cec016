"""RFC 9113 scenarios: what a peer sends, and the verdict every backend owes it.

Each :class:`Scenario` sends its frames on a fresh connection (:class:`Peer`,
after the preface and an empty SETTINGS) and names the stream whose fate is the
verdict. ``expected`` is RFC 9113's answer, as :attr:`Verdict.label`
(``answer 0``: a gRPC answer with status OK; ``connection PROTOCOL_ERROR``:
GOAWAY with that code; ``stream FLOW_CONTROL_ERROR``: RST_STREAM on the
stream). Where a backend's verdict legitimately differs in detail, ``accepted``
lists the other labels RFC 9113 allows, and ``why`` says why: the tables
assert the shared class. Shared by tests/conformance/test_h2_table.py and
bench/h2_conformance.py.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from tests.conformance.peer import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PADDED,
    PING,
    PRIORITY,
    PRIORITY_FLAG,
    PUSH_PROMISE,
    Peer,
    frame,
    grpc_message,
    literal_block,
    request_headers,
    rst_stream,
    settings,
    window_update,
)

#: SETTINGS identifiers (RFC 9113 section 6.5.2).
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6
MAX_WINDOW = 2**31 - 1
PING_PAYLOAD = b"conform!"


@dataclass(frozen=True)
class Scenario:
    """``send`` writes the frames and returns the stream to watch."""

    name: str
    send: Callable[[Peer], int]
    expected: str
    accepted: tuple[str, ...] = ()
    why: str = ""
    #: The RFC 9113 section that says so.
    rfc: str = ""
    #: Whether the verdict may send its probe call (see ``Peer.verdict``).
    probe: bool = True
    #: False where RFC 9113 sets no rule, so backends may differ even in class.
    same_class: bool = True


def _call_after(
    *frames: bytes | Callable[[Peer], bytes], stream_id: int = 1
) -> Callable[[Peer], int]:
    """Frames (or makers of them), then a well-behaved call on ``stream_id``: the
    server ignored them if that call is answered."""

    def send(peer: Peer) -> int:
        for item in frames:
            peer.send(item(peer) if callable(item) else item)
        peer.send(peer.call(stream_id))
        return stream_id

    return send


def _only(*frames: bytes) -> Callable[[Peer], int]:
    def send(peer: Peer) -> int:
        peer.send(b"".join(frames))
        return 1

    return send


def _open_then(*frames: bytes) -> Callable[[Peer], int]:
    """Stream 1 opened (HEADERS, no END_STREAM), then ``frames``."""

    def send(peer: Peer) -> int:
        peer.send(peer.headers(1, request_headers(), end=False) + b"".join(frames))
        return 1

    return send


def _request_without_message(peer: Peer) -> int:
    """Stream 1's HEADERS end the stream: a call with no message at all."""
    peer.send(peer.headers(1, request_headers(), end=True))
    return 1


def _answered_then(*frames: bytes) -> Callable[[Peer], int]:
    """A call on stream 1 answered and read, then ``frames``: the verdict is about them."""

    def send(peer: Peer) -> int:
        peer.send(peer.call(1))
        answer = peer.verdict(1)
        assert answer.label == "answer 0", answer
        peer.mark()
        peer.send(b"".join(frames))
        return 1

    return send


def _malformed(headers: list[tuple[str, str]], body: bytes | None = None) -> Callable[[Peer], int]:
    def send(peer: Peer) -> int:
        data = grpc_message(b"hi") if body is None else body
        peer.send(
            frame(HEADERS, END_HEADERS, 1, peer.block(headers)) + frame(DATA, END_STREAM, 1, data)
        )
        return 1

    return send


def _continued(peer: Peer) -> int:
    block = peer.block(request_headers())
    third = len(block) // 3
    peer.send(
        frame(HEADERS, 0, 1, block[:third])
        + frame(CONTINUATION, 0, 1, block[third : 2 * third])
        + frame(CONTINUATION, END_HEADERS, 1, block[2 * third :])
        + frame(DATA, END_STREAM, 1, grpc_message(b"hi"))
    )
    return 1


def _interrupted_block(other: bytes) -> Callable[[Peer], int]:
    def send(peer: Peer) -> int:
        block = peer.block(request_headers())
        peer.send(frame(HEADERS, 0, 1, block[:4]) + other)
        return 1

    return send


def _trailers(peer: Peer) -> int:
    peer.send(
        peer.headers(1, request_headers(), end=False)
        + frame(DATA, 0, 1, grpc_message(b"hi"))
        + frame(HEADERS, END_HEADERS | END_STREAM, 1, peer.block([("x-trailer", "1")]))
    )
    return 1


def _reset_mid_body(peer: Peer) -> int:
    """Stream 1 reset halfway through its message; stream 3 must be served."""
    message = grpc_message(b"x" * 64)
    peer.send(
        peer.headers(1, request_headers(), end=False)
        + frame(DATA, 0, 1, message[:20])
        + rst_stream(1, 0x8)
        + peer.call(3)
    )
    return 3


def _regression(peer: Peer) -> int:
    peer.send(peer.call(3))
    peer.verdict(3)
    peer.mark()
    peer.send(peer.call(1))
    return 1


def _client_goaway(peer: Peer) -> int:
    peer.send(peer.call(1) + frame(GOAWAY, 0, 0, struct.pack(">II", 0, 0)))
    return 1


def _ping(peer: Peer) -> int:
    peer.send(frame(PING, 0, 0, PING_PAYLOAD) + peer.call(1))
    return 1


def _priority_headers(peer: Peer) -> int:
    priority = struct.pack(">IB", 0, 15)  # depends on stream 0, weight 16
    peer.send(
        frame(HEADERS, END_HEADERS | PRIORITY_FLAG, 1, priority + peer.block(request_headers()))
        + frame(DATA, END_STREAM, 1, grpc_message(b"hi"))
    )
    return 1


def _padded_data(peer: Peer) -> int:
    message = grpc_message(b"hi")
    peer.send(
        peer.headers(1, request_headers(), end=False)
        + frame(DATA, END_STREAM | PADDED, 1, bytes([10]) + message + b"\0" * 10)
    )
    return 1


def _big_header(size: int) -> Callable[[Peer], int]:
    def send(peer: Peer) -> int:
        block = literal_block(request_headers(extra=(("x-big", "v" * size),)))
        chunks = [block[i : i + 16384] for i in range(0, len(block), 16384)]
        out = frame(HEADERS, END_HEADERS if len(chunks) == 1 else 0, 1, chunks[0])
        for index, chunk in enumerate(chunks[1:], 1):
            out += frame(CONTINUATION, END_HEADERS if index == len(chunks) - 1 else 0, 1, chunk)
        peer.send(out + frame(DATA, END_STREAM, 1, grpc_message(b"hi")))
        return 1

    return send


def _window_reopened(peer: Peer) -> int:
    """The client's initial window at 0, a 30 KB answer asked for, then the window
    opened by SETTINGS (RFC 9113 6.9.2: the change applies to open streams)."""
    peer.send(
        settings((INITIAL_WINDOW_SIZE, 0))
        + peer.headers(1, request_headers("Fill"), end=False)
        + frame(DATA, END_STREAM, 1, grpc_message(b"30000"))
    )
    peer.verdict(1, wait=0.3, probe=False)  # the answer waits on the window
    peer.send(settings((INITIAL_WINDOW_SIZE, 65535)))
    return 1


def _padded_priority_headers(peer: Peer) -> int:
    block = bytes([3]) + struct.pack(">IB", 0, 15) + peer.block(request_headers()) + b"\0" * 3
    peer.send(
        frame(HEADERS, END_HEADERS | PADDED | PRIORITY_FLAG, 1, block)
        + frame(DATA, END_STREAM, 1, grpc_message(b"hi"))
    )
    return 1


def _data_after_own_reset(peer: Peer) -> int:
    peer.send(
        peer.headers(1, request_headers(), end=False)
        + rst_stream(1, 0x8)
        + frame(DATA, 0, 1, grpc_message(b"late"))
    )
    return 1


def _too_many_streams(peer: Peer) -> int:
    """One stream over the advertised SETTINGS_MAX_CONCURRENT_STREAMS (128 on both)."""
    out = b"".join(peer.headers(1 + 2 * n, request_headers(), end=False) for n in range(129))
    peer.send(out)
    return 1 + 2 * 128


def _trailers_with(headers: list[tuple[str, str]], *, end: bool) -> Callable[[Peer], int]:
    def send(peer: Peer) -> int:
        flags = END_HEADERS | (END_STREAM if end else 0)
        peer.send(
            peer.headers(1, request_headers(), end=False)
            + frame(DATA, 0, 1, grpc_message(b"hi"))
            + frame(HEADERS, flags, 1, peer.block(headers))
        )
        return 1

    return send


_UPPERCASE = [*request_headers(), ("X-Upper", "1")]
_CONNECTION = [*request_headers(), ("connection", "keep-alive")]
_NO_PATH = [h for h in request_headers() if h[0] != ":path"]
_LENGTH = [*request_headers(), ("content-length", "100")]

# Why Envoy's verdicts differ in detail (the shared class is asserted):
_ENVOY_MALFORMED = (
    "malformed request headers: RFC 9113 section 8.1.1 makes it a stream error; Envoy's "
    "codec (stream_error_on_invalid_http_messaging off, its default) ends the connection "
    "instead; either way the request never reaches the app"
)
_CLOSED_CODE = (
    "a frame on a closed stream: RFC 9113 section 5.1 allows STREAM_CLOSED as a stream or a "
    "connection error, and a lower id is also PROTOCOL_ERROR (5.1.1)"
)
_ENVOY_PRIORITY = (
    "RFC 9113 deprecates the priority signals (section 5.3.2) but keeps section 6.3's rule "
    "that PRIORITY on stream 0 is a connection error; Envoy's codec drops PRIORITY frames "
    "before it checks them. The frame carries nothing for the app either way"
)
_IGNORED_CLOSED = (
    "a frame on a stream the server has closed: RFC 9113 section 5.1 lets it treat the frame "
    "as a connection error (STREAM_CLOSED) or, for frames that may still be in flight, "
    "ignore it, as Envoy's codec does (a HEADERS under the highest id it saw included); "
    "either way no call reaches the app"
)
_TOO_BIG = (
    "a header list over the server's limit: RFC 9113 section 10.5.1 lets a server refuse it "
    "with a stream reset, a 431 or a connection error (it is past the advertised "
    "SETTINGS_MAX_HEADER_LIST_SIZE)"
)

SCENARIOS: tuple[Scenario, ...] = (
    Scenario("a well-behaved call", _call_after(), "answer 0", rfc="8.1"),
    # SETTINGS edge values.
    Scenario(
        "SETTINGS_INITIAL_WINDOW_SIZE at its maximum",
        _call_after(settings((INITIAL_WINDOW_SIZE, MAX_WINDOW))),
        "answer 0",
        rfc="6.5.2",
    ),
    Scenario(
        "SETTINGS_INITIAL_WINDOW_SIZE over 2^31-1",
        _only(settings((INITIAL_WINDOW_SIZE, MAX_WINDOW + 1))),
        "connection FLOW_CONTROL_ERROR",
        rfc="6.5.2",
    ),
    Scenario(
        "SETTINGS_MAX_FRAME_SIZE below 16384",
        _only(settings((MAX_FRAME_SIZE, 16383))),
        "connection PROTOCOL_ERROR",
        rfc="6.5.2",
    ),
    Scenario(
        "SETTINGS_MAX_FRAME_SIZE over 2^24-1",
        _only(settings((MAX_FRAME_SIZE, 1 << 24))),
        "connection PROTOCOL_ERROR",
        rfc="6.5.2",
    ),
    Scenario(
        "SETTINGS_ENABLE_PUSH of 2",
        _only(settings((ENABLE_PUSH, 2))),
        "connection PROTOCOL_ERROR",
        rfc="6.5.2",
    ),
    Scenario(
        "SETTINGS_HEADER_TABLE_SIZE of 0",
        _call_after(settings((HEADER_TABLE_SIZE, 0))),
        "answer 0",
        rfc="6.5.2",
    ),
    Scenario(
        "an unknown setting is ignored", _call_after(settings((0xFF, 7))), "answer 0", rfc="6.5.2"
    ),
    Scenario(
        "SETTINGS of a length not a multiple of 6",
        _only(frame(4, 0, 0, b"\0" * 5)),
        "connection FRAME_SIZE_ERROR",
        rfc="6.5",
    ),
    Scenario(
        "SETTINGS ACK with a payload",
        _only(frame(4, 1, 0, b"\0" * 6)),
        "connection FRAME_SIZE_ERROR",
        rfc="6.5",
    ),
    Scenario(
        "an unsolicited SETTINGS ACK",
        _call_after(settings(ack=True)),
        "answer 0",
        accepted=("connection PROTOCOL_ERROR",),
        why="RFC 9113 sets no rule for an ACK of SETTINGS never sent; the h2 backend "
        "ignores it, Envoy's codec ends the connection",
        rfc="6.5.3",
        same_class=False,
    ),
    Scenario(
        "SETTINGS on a stream", _only(frame(4, 0, 1, b"")), "connection PROTOCOL_ERROR", rfc="6.5"
    ),
    # WINDOW_UPDATE.
    Scenario(
        "WINDOW_UPDATE overflowing the connection window",
        _only(window_update(0, MAX_WINDOW)),
        "connection FLOW_CONTROL_ERROR",
        rfc="6.9.1",
    ),
    Scenario(
        "WINDOW_UPDATE overflowing a stream window",
        _open_then(window_update(1, MAX_WINDOW)),
        "stream FLOW_CONTROL_ERROR",
        rfc="6.9.1",
    ),
    Scenario(
        "WINDOW_UPDATE of 0 on the connection",
        _only(window_update(0, 0)),
        "connection PROTOCOL_ERROR",
        rfc="6.9",
    ),
    Scenario(
        "WINDOW_UPDATE of 0 on a stream",
        _open_then(window_update(1, 0)),
        "stream PROTOCOL_ERROR",
        rfc="6.9",
    ),
    Scenario(
        "WINDOW_UPDATE of 3 bytes",
        _only(frame(8, 0, 0, b"\0\0\1")),
        "connection FRAME_SIZE_ERROR",
        rfc="6.9",
    ),
    # PING.
    Scenario("PING is acknowledged, the call served", _ping, "answer 0", rfc="6.7"),
    Scenario(
        "PING of 7 bytes",
        _only(frame(PING, 0, 0, b"\0" * 7)),
        "connection FRAME_SIZE_ERROR",
        rfc="6.7",
    ),
    Scenario(
        "PING on a stream",
        _only(frame(PING, 0, 1, b"\0" * 8)),
        "connection PROTOCOL_ERROR",
        rfc="6.7",
    ),
    # Priority.
    Scenario(
        "PRIORITY on an idle stream is harmless",
        _call_after(frame(PRIORITY, 0, 5, struct.pack(">IB", 0, 15))),
        "answer 0",
        rfc="6.3",
    ),
    Scenario("HEADERS with the PRIORITY flag", _priority_headers, "answer 0", rfc="6.2"),
    Scenario(
        "PRIORITY of 4 bytes",
        _open_then(frame(PRIORITY, 0, 1, b"\0" * 4)),
        "stream FRAME_SIZE_ERROR",
        accepted=("connection FRAME_SIZE_ERROR",),
        why="RFC 9113 section 6.3 makes it a stream error; a codec that reads the frame "
        "header first may end the connection",
        rfc="6.3",
    ),
    Scenario(
        "PRIORITY on stream 0",
        _only(frame(PRIORITY, 0, 0, struct.pack(">IB", 0, 15))),
        "connection PROTOCOL_ERROR",
        accepted=("silent",),
        why=_ENVOY_PRIORITY,
        rfc="6.3",
    ),
    # RST_STREAM.
    Scenario(
        "RST_STREAM in the middle of a body: the next stream is served",
        _reset_mid_body,
        "answer 0",
        rfc="6.4",
    ),
    Scenario(
        "RST_STREAM on an idle stream",
        _only(rst_stream(1, 8)),
        "connection PROTOCOL_ERROR",
        rfc="6.4",
    ),
    Scenario(
        "RST_STREAM of 3 bytes",
        _open_then(frame(3, 0, 1, b"\0\0\0")),
        "connection FRAME_SIZE_ERROR",
        rfc="6.4",
    ),
    # Header blocks.
    Scenario("a header block in HEADERS and two CONTINUATIONs", _continued, "answer 0", rfc="6.10"),
    Scenario(
        "a header block interrupted by PING",
        _interrupted_block(frame(PING, 0, 0, b"\0" * 8)),
        "connection PROTOCOL_ERROR",
        rfc="6.10",
    ),
    Scenario(
        "a header block continued on another stream",
        _interrupted_block(frame(CONTINUATION, END_HEADERS, 3, b"\x82")),
        "connection PROTOCOL_ERROR",
        rfc="6.10",
    ),
    Scenario(
        "CONTINUATION without HEADERS",
        _only(frame(CONTINUATION, END_HEADERS, 1, b"\x82")),
        "connection PROTOCOL_ERROR",
        rfc="6.10",
    ),
    Scenario("request trailers", _trailers, "answer 0", rfc="8.1"),
    Scenario(
        "a 100 KB header list",
        _big_header(100_000),
        "connection ENHANCE_YOUR_CALM",
        accepted=(
            "connection COMPRESSION_ERROR",
            "connection PROTOCOL_ERROR",
            "stream PROTOCOL_ERROR",
            "answer http 431",
        ),
        why=_TOO_BIG,
        rfc="10.5.1",
    ),
    # Stream identifiers.
    Scenario(
        "a stream id lower than one already opened",
        _regression,
        "connection PROTOCOL_ERROR",
        accepted=("connection STREAM_CLOSED", "silent"),
        why=f"{_CLOSED_CODE}; {_IGNORED_CLOSED}",
        rfc="5.1.1",
    ),
    Scenario(
        "a stream id reused after its stream closed",
        _answered_then(frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\x83\x86\x84")),
        "connection STREAM_CLOSED",
        accepted=("connection PROTOCOL_ERROR", "stream STREAM_CLOSED", "silent"),
        why=f"{_CLOSED_CODE}; {_IGNORED_CLOSED}",
        rfc="5.1",
    ),
    Scenario(
        "an even stream id from the client",
        _call_after(stream_id=2),
        "connection PROTOCOL_ERROR",
        rfc="5.1.1",
    ),
    Scenario(
        "PUSH_PROMISE from the client",
        _only(frame(PUSH_PROMISE, END_HEADERS, 1, b"\0\0\0\2")),
        "connection PROTOCOL_ERROR",
        rfc="8.4",
    ),
    # DATA.
    Scenario(
        "DATA on a closed stream",
        _answered_then(frame(DATA, 0, 1, grpc_message(b"x"))),
        "connection STREAM_CLOSED",
        accepted=("stream STREAM_CLOSED", "silent"),
        why=f"{_CLOSED_CODE}; {_IGNORED_CLOSED}",
        rfc="6.1",
    ),
    Scenario(
        "DATA on an idle stream",
        _only(frame(DATA, 0, 1, grpc_message(b"x"))),
        "connection PROTOCOL_ERROR",
        rfc="6.1",
    ),
    Scenario(
        "DATA on stream 0", _only(frame(DATA, 0, 0, b"x")), "connection PROTOCOL_ERROR", rfc="6.1"
    ),
    Scenario("DATA with padding", _padded_data, "answer 0", rfc="6.1"),
    Scenario(
        "DATA with padding longer than the frame",
        _open_then(frame(DATA, PADDED, 1, bytes([40]) + b"abc")),
        "connection PROTOCOL_ERROR",
        rfc="6.1",
    ),
    # Malformed requests.
    Scenario(
        "an uppercase header name",
        _malformed(_UPPERCASE),
        "stream PROTOCOL_ERROR",
        accepted=("connection PROTOCOL_ERROR",),
        why=_ENVOY_MALFORMED,
        rfc="8.2.1",
    ),
    Scenario(
        "a connection-specific header",
        _malformed(_CONNECTION),
        "stream PROTOCOL_ERROR",
        accepted=("connection PROTOCOL_ERROR",),
        why=_ENVOY_MALFORMED,
        rfc="8.2.2",
    ),
    Scenario(
        "no :path",
        _malformed(_NO_PATH),
        "stream PROTOCOL_ERROR",
        accepted=("connection PROTOCOL_ERROR",),
        why=_ENVOY_MALFORMED,
        rfc="8.3.1",
    ),
    Scenario(
        "content-length not the body's",
        _malformed(_LENGTH),
        "stream PROTOCOL_ERROR",
        accepted=("connection PROTOCOL_ERROR",),
        why=_ENVOY_MALFORMED,
        rfc="8.1.1",
    ),
    Scenario(
        "the initial window at 0, then opened by SETTINGS",
        _window_reopened,
        "answer 0",
        rfc="6.9.2",
        probe=False,
    ),
    Scenario(
        "HEADERS padded and with the PRIORITY flag", _padded_priority_headers, "answer 0", rfc="6.2"
    ),
    Scenario(
        "HEADERS with padding longer than the frame",
        _only(frame(HEADERS, END_HEADERS | PADDED, 1, bytes([200]) + b"\x82")),
        "connection PROTOCOL_ERROR",
        rfc="6.2",
    ),
    Scenario(
        "a request without a message",
        _request_without_message,
        "answer 13",
        rfc="8.1",
    ),
    Scenario(
        "DATA after the client reset its stream",
        _data_after_own_reset,
        "connection STREAM_CLOSED",
        accepted=("stream STREAM_CLOSED", "silent"),
        why=f"{_CLOSED_CODE}; {_IGNORED_CLOSED}",
        rfc="5.1",
    ),
    Scenario(
        "one stream over SETTINGS_MAX_CONCURRENT_STREAMS",
        _too_many_streams,
        "stream REFUSED_STREAM",
        accepted=("stream PROTOCOL_ERROR",),
        why="RFC 9113 section 5.1.2 allows either code",
        rfc="5.1.2",
    ),
    Scenario(
        "trailers with a pseudo-header",
        _trailers_with([(":path", "/x")], end=True),
        "stream PROTOCOL_ERROR",
        accepted=("connection PROTOCOL_ERROR",),
        why=_ENVOY_MALFORMED,
        rfc="8.1",
    ),
    Scenario(
        "trailers without END_STREAM",
        _trailers_with([("x-trailer", "1")], end=False),
        "stream PROTOCOL_ERROR",
        accepted=("connection PROTOCOL_ERROR",),
        why=_ENVOY_MALFORMED,
        rfc="8.1",
    ),
    # Extensions and the end of the connection.
    Scenario(
        "an unknown frame type is ignored",
        _call_after(frame(0xEE, 0, 0, b"ignored")),
        "answer 0",
        rfc="5.5",
    ),
    Scenario(
        "the client's GOAWAY: its open call is still answered",
        _client_goaway,
        "answer 0",
        rfc="6.8",
        probe=False,
    ),
)


def run(port: int, scenario: Scenario, *, timeout: float = 10) -> tuple[str, Peer]:
    """The verdict label of ``scenario`` against the server on ``port``."""
    with Peer(port, timeout=timeout) as peer:
        stream_id = scenario.send(peer)
        return peer.verdict(stream_id, probe=scenario.probe).label, peer


def allowed(scenario: Scenario) -> set[str]:
    """Every label RFC 9113 allows for ``scenario``: the expected one, those listed,
    and two general allowances: an endpoint MAY treat a stream error as a
    connection error (section 5.4), and SHOULD (not MUST) send GOAWAY before it
    closes for a connection error (5.4.1: Envoy's codec closes at once for
    several of these, without one)."""
    labels = {scenario.expected, *scenario.accepted}
    for label in list(labels):
        kind, _, code = label.partition(" ")
        if kind == "stream":
            labels.add(f"connection {code}")
        if kind in ("stream", "connection"):
            labels.add("connection closed")
    return labels


def verdict_class(label: str) -> str:
    """``served <status>`` (the app answered), or ``refused``: a connection or a
    stream error, or frames the server let pass (``silent``): no call reached
    the app from them. ``hung`` is its own class, and always a failure."""
    kind, _, rest = label.partition(" ")
    if kind == "answer":
        return f"served {rest}"
    if kind in ("connection", "stream", "silent"):
        return "refused"
    return label
