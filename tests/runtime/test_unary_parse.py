"""The unary path's one parse (``asgi_grpc.grpc_head`` and ``whole_message``, which both
entries of ``GrpcAsgiApp`` use) against the plain reading it stands for.

The speed tricks: comparing the exact ``application/grpc`` bytes before
decoding a content type, a cache of parsed ``grpc-timeout`` values, and
reading a one-message body by its prefix instead of through
:class:`MessageReader`. Each is pinned to the plain version (``grpc_wire``'s
``is_grpc_content_type``, ``parse_timeout`` and ``MessageReader``): same
inputs, same outputs, on a table of named cases (malformed framing, the
compressed flag, a length mismatch, oversized, no content type) and on
seeded hypothesis examples. Then the two entries: ``complete_unary`` serves
exactly what the plain reading says is a plain unary call, with the ASGI
path's answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplane.asgi_grpc import _MAX_TIMEOUTS, _TIMEOUTS, grpc_head, whole_message
from meshplane.grpc_wire import (
    DEFAULT_MAX_MESSAGE_BYTES,
    MessageReader,
    RpcError,
    frame,
    is_grpc_content_type,
    parse_timeout,
)
from tests.runtime.test_asgi_complete_unary import RecordingResponder, _app, _asgi_answer

Headers = Sequence[tuple[bytes, bytes]]


def plain_message(body: bytes, limit: int) -> bytes | None:
    """The one uncompressed message of ``body`` as MessageReader reads it, or None."""
    reader = MessageReader(None, limit)
    try:
        messages = reader.feed(body)
    except RpcError:
        return None
    if reader.pending or len(messages) != 1 or body[0] != 0:
        return None
    return messages[0]


def plain_head(method: str, headers: Headers) -> tuple[bytes | None, float | None, bool] | None:
    """What the headers say, read the slow, obvious way (the last of each name)."""
    last = {name: value for name, value in headers}
    content_type = last.get(b"content-type")
    if (
        method != "POST"
        or content_type is None
        or not is_grpc_content_type(content_type.decode("latin-1"))
    ):
        return None
    timeout = last.get(b"grpc-timeout")
    traced = any(name in (b"traceparent", b"tracestate") for name, _ in headers)
    return (
        last.get(b"grpc-encoding"),
        None if timeout is None else parse_timeout(timeout.decode("latin-1")),
        traced,
    )


LIMIT = 64
BODIES = [
    ("one message", frame(b"hello")),
    ("an empty message", frame(b"")),
    ("no body", b""),
    ("a prefix cut short", frame(b"hello")[:3]),
    ("a message cut short", frame(b"hello")[:-1]),
    ("length over the bytes", b"\x00\x00\x00\x00\x09hello"),
    ("length under the bytes", b"\x00\x00\x00\x00\x02hello"),
    ("two messages", frame(b"a") + frame(b"b")),
    ("compressed flag", b"\x01" + frame(b"hello")[1:]),
    ("a flag of 2", b"\x02" + frame(b"hello")[1:]),
    ("at the limit", frame(b"x" * LIMIT)),
    ("over the limit", frame(b"x" * (LIMIT + 1))),
    ("a huge declared length", b"\x00\xff\xff\xff\xffx"),
]


@pytest.mark.parametrize(("body"), [b for _, b in BODIES], ids=[n for n, _ in BODIES])
def test_whole_message_reads_what_message_reader_reads(body: bytes) -> None:
    assert whole_message(body, LIMIT) == plain_message(body, LIMIT)


GRPC = (b"content-type", b"application/grpc")
HEADS = [
    ("gRPC", "POST", [GRPC]),
    ("gRPC with a subtype", "POST", [(b"content-type", b"application/grpc+proto")]),
    ("gRPC with parameters", "POST", [(b"content-type", b"application/grpc;charset=utf-8")]),
    ("upper case", "POST", [(b"content-type", b"Application/GRPC")]),
    ("a look-alike", "POST", [(b"content-type", b"application/grpcx")]),
    ("not gRPC", "POST", [(b"content-type", b"text/plain")]),
    ("no content type", "POST", []),
    ("GET", "GET", [GRPC]),
    ("the last content type counts", "POST", [GRPC, (b"content-type", b"text/plain")]),
    ("a timeout", "POST", [GRPC, (b"grpc-timeout", b"100m")]),
    ("a malformed timeout", "POST", [GRPC, (b"grpc-timeout", b"soon")]),
    ("an encoding", "POST", [GRPC, (b"grpc-encoding", b"gzip")]),
    ("traced", "POST", [GRPC, (b"traceparent", b"00-ab-cd-01")]),
    ("tracestate only", "POST", [GRPC, (b"tracestate", b"k=v")]),
]


@pytest.mark.parametrize(("method", "headers"), [h[1:] for h in HEADS], ids=[h[0] for h in HEADS])
def test_grpc_head_reads_what_the_plain_reading_reads(method: str, headers: Headers) -> None:
    assert grpc_head(method, headers) == plain_head(method, headers)


def test_the_timeout_cache_answers_as_parse_timeout_and_stays_bounded() -> None:
    values = [f"{n}{unit}".encode() for n in range(200) for unit in "HMSmun"] + [b"x", b"1"]
    for _ in range(2):  # filled, then answered from the cache (or refilled)
        for value in values:
            head = grpc_head("POST", [GRPC, (b"grpc-timeout", value)])
            assert head is not None
            assert head[1] == parse_timeout(value.decode())
            assert len(_TIMEOUTS) <= _MAX_TIMEOUTS


# ---- seeded examples -----------------------------------------------------------------

_FLAGS = st.sampled_from([0, 0, 0, 1, 2, 255])


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """Bodies near the rule: prefixes with lengths off by a little, flags, cuts, joins."""
    payload = draw(st.binary(max_size=LIMIT + 4))
    length = max(0, len(payload) + draw(st.sampled_from([0, 0, -1, 1, 5, 1 << 30])))
    body = bytes([draw(_FLAGS)]) + min(length, 2**32 - 1).to_bytes(4, "big") + payload
    cut = draw(st.integers(0, len(body)))
    return draw(st.sampled_from([body, body[:cut], body + frame(b"z"), draw(st.binary())]))


_NAMES = st.sampled_from(
    [b"content-type", b"grpc-encoding", b"grpc-timeout", b"traceparent", b"tracestate",
     b"te", b"user-agent"]
)  # fmt: skip
_VALUES = st.sampled_from(
    [b"application/grpc", b"application/grpc+proto", b"APPLICATION/GRPC", b"application/grpc;x",
     b"application/grpcx", b"text/plain", b"", b"1S", b"250m", b"99999999n", b"bad", b"gzip",
     b"\xff\xfe"]
)  # fmt: skip
_HEADERS = st.lists(st.tuples(_NAMES, _VALUES), max_size=6)
_METHODS = st.sampled_from(["POST", "POST", "GET", "PUT"])


@settings(max_examples=200, derandomize=True, database=None, deadline=None)
@given(body=bodies(), limit=st.sampled_from([0, 4, LIMIT, DEFAULT_MAX_MESSAGE_BYTES]))
def test_whole_message_matches_message_reader_on_seeded_bodies(body: bytes, limit: int) -> None:
    assert whole_message(body, limit) == plain_message(body, limit)


@settings(max_examples=200, derandomize=True, database=None, deadline=None)
@given(method=_METHODS, headers=_HEADERS)
def test_grpc_head_matches_the_plain_reading_on_seeded_headers(
    method: str, headers: list[tuple[bytes, bytes]]
) -> None:
    assert grpc_head(method, headers) == plain_head(method, headers)


@settings(max_examples=100, derandomize=True, database=None, deadline=None)
@given(
    method=_METHODS,
    headers=_HEADERS,
    body=bodies(),
    path=st.sampled_from(["/t.S/Echo", "/t.S/Nope", "/grpc.health.v1.Health/Watch"]),
)
async def test_complete_unary_serves_exactly_the_plain_unary_calls_with_the_asgi_answer(
    method: str, headers: list[tuple[bytes, bytes]], body: bytes, path: str
) -> None:
    app = _app()
    responder = RecordingResponder()
    call = app.complete_unary(method, path, headers, body, responder)
    plain = (
        path == "/t.S/Echo"
        and plain_head(method, headers) is not None
        and plain_message(body, DEFAULT_MAX_MESSAGE_BYTES) is not None
    )
    assert (call is not None) == plain
    if call is None:
        assert responder.answers == []
        return
    await call
    answer: Any = await _asgi_answer(app, method, path, headers, body)
    assert responder.answers == [answer]
