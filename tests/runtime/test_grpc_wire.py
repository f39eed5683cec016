"""The gRPC wire rules as pure functions: framing, compression, limits, timeouts."""

from __future__ import annotations

import gzip

import pytest

from meshplane.grpc_wire import (
    Code,
    MessageReader,
    RpcError,
    encode_message,
    frame,
    is_grpc_content_type,
    parse_timeout,
    status_headers,
)


def test_messages_are_reassembled_from_any_chunking() -> None:
    data = frame(b"hello") + frame(b"") + frame(b"world!")
    for size in (1, 2, 3, 5, 7, len(data)):
        reader = MessageReader()
        got: list[bytes] = []
        for start in range(0, len(data), size):
            got += reader.feed(data[start : start + size])
        assert got == [b"hello", b"", b"world!"], size
        assert not reader.pending


def test_a_partial_message_is_pending() -> None:
    reader = MessageReader()
    assert reader.feed(frame(b"hello")[:7]) == []
    assert reader.pending


@pytest.mark.parametrize(
    ("encoding", "payload", "code"),
    [
        (None, b"x", Code.UNIMPLEMENTED),  # compressed flag, no encoding named
        ("identity", b"x", Code.UNIMPLEMENTED),
        ("snappy", b"x", Code.UNIMPLEMENTED),
        ("gzip", b"not gzip", Code.INTERNAL),
    ],
)
def test_compressed_messages_it_cannot_decode(
    encoding: str | None, payload: bytes, code: Code
) -> None:
    reader = MessageReader(encoding)
    with pytest.raises(RpcError) as caught:
        reader.feed(b"\x01" + len(payload).to_bytes(4, "big") + payload)
    assert caught.value.code == code


def test_gzip_is_decoded() -> None:
    packed = gzip.compress(b"inflate me")
    assert MessageReader("gzip").feed(b"\x01" + len(packed).to_bytes(4, "big") + packed) == [
        b"inflate me"
    ]


def test_the_size_limit_holds_before_and_after_inflating() -> None:
    with pytest.raises(RpcError) as caught:
        MessageReader(max_bytes=10).feed(b"\x00" + (11).to_bytes(4, "big"))
    assert caught.value.code == Code.RESOURCE_EXHAUSTED
    bomb = gzip.compress(b"\x00" * 100_000)  # ~100 bytes on the wire
    with pytest.raises(RpcError) as caught:
        MessageReader("gzip", max_bytes=1000).feed(b"\x01" + len(bomb).to_bytes(4, "big") + bomb)
    assert caught.value.code == Code.RESOURCE_EXHAUSTED


def test_an_invalid_compressed_flag() -> None:
    with pytest.raises(RpcError) as caught:
        MessageReader().feed(b"\x02" + (0).to_bytes(4, "big"))
    assert caught.value.code == Code.INTERNAL


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("1H", 3600.0),
        ("2M", 120.0),
        ("3S", 3.0),
        ("250m", 0.25),
        ("100u", 1e-4),
        ("5n", 5e-9),
        ("99999999S", 99999999.0),
        ("123456789S", None),  # at most 8 digits
        ("S", None),
        ("1x", None),
        ("-1S", None),
        ("", None),
    ],
)
def test_grpc_timeout(header: str, seconds: float | None) -> None:
    assert parse_timeout(header) == (None if seconds is None else pytest.approx(seconds))


def test_status_headers_percent_encode_the_message() -> None:
    assert status_headers(Code.OK) == [(b"grpc-status", b"0")]
    assert status_headers(Code.UNAVAILABLE, "50% down: é") == [
        (b"grpc-status", b"14"),
        (b"grpc-message", b"50%25 down: %C3%A9"),
    ]
    assert encode_message("plain ascii ~") == "plain ascii ~"


@pytest.mark.parametrize(
    ("value", "grpc"),
    [
        ("application/grpc", True),
        ("application/grpc+proto", True),
        ("Application/GRPC;charset=utf-8", True),
        ("application/grpc-web", False),
        ("application/json", False),
    ],
)
def test_content_types(value: str, grpc: bool) -> None:
    assert is_grpc_content_type(value) is grpc
