"""Our response header blocks decode, with a real HPACK decoder, to what we encoded,
and never touch the decoder's dynamic table (so constant blocks stay valid)."""

from __future__ import annotations

import hpack
import pytest

from meshplane.servers.h2.http2.hpack_blocks import (
    RESPONSE_GRPC,
    TRAILERS_OK,
    encode_headers,
    table_size_update,
)

CASES: list[tuple[str, list[tuple[bytes, bytes]]]] = [
    ("static exact", [(b":status", b"200")]),
    ("static name, other value", [(b":status", b"415"), (b"content-type", b"application/grpc")]),
    ("new names", [(b"grpc-status", b"13"), (b"grpc-message", b"bad%20thing")]),
    ("empty value", [(b"grpc-message", b"")]),
    ("long value (multi-byte length)", [(b"x-long", b"v" * 300)]),
    ("long name", [(b"x-" + b"n" * 200, b"1")]),
    ("value exactly 127", [(b"x", b"a" * 127)]),
    ("non-ascii value bytes", [(b"x-bin", bytes(range(128, 256)))]),
]


@pytest.mark.parametrize(("case", "headers"), CASES, ids=[c[0] for c in CASES])
def test_blocks_decode_to_their_headers_and_leave_the_table_empty(
    case: str, headers: list[tuple[bytes, bytes]]
) -> None:
    decoder = hpack.Decoder()
    assert decoder.decode(encode_headers(headers), raw=True) == headers
    assert not decoder.header_table.dynamic_entries


def test_constant_blocks() -> None:
    decoder = hpack.Decoder()
    assert decoder.decode(RESPONSE_GRPC, raw=True) == [
        (b":status", b"200"),
        (b"content-type", b"application/grpc"),
    ]
    assert decoder.decode(TRAILERS_OK, raw=True) == [(b"grpc-status", b"0")]
    assert not decoder.header_table.dynamic_entries


@pytest.mark.parametrize("size", [0, 30, 31, 4096])
def test_table_size_update_is_understood(size: int) -> None:
    decoder = hpack.Decoder()
    decoded = list(decoder.decode(table_size_update(size) + RESPONSE_GRPC, raw=True))
    assert decoded[0] == (b":status", b"200")
    assert decoder.header_table_size == size
