"""HPACK-encoded response header blocks that never touch the peer's dynamic table.

We only ever emit indexed static-table fields and literals *without indexing*
(RFC 7541 6.1, 6.2.2), never Huffman: the peer's dynamic table is never
written, so a block encodes the same headers for the connection's whole life
and constant blocks (``RESPONSE_GRPC``, ``TRAILERS_OK``) can be encoded once
at import and sent as bytes. Hence no encoder state, and no table-size
bookkeeping beyond the size update the connection prepends when the peer
shrinks its table (see :mod:`meshplane.servers.h2.http2.connection`).
"""

from __future__ import annotations

from collections.abc import Sequence

#: RFC 7541 Appendix A: the static table, 1-based.
STATIC_TABLE: tuple[tuple[bytes, bytes], ...] = (
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
)

_EXACT: dict[tuple[bytes, bytes], int] = {}
_NAME: dict[bytes, int] = {}
for _index, _field in enumerate(STATIC_TABLE, start=1):
    _EXACT.setdefault(_field, _index)
    _NAME.setdefault(_field[0], _index)


def encode_integer(value: int, prefix_bits: int, first: int) -> bytes:
    """RFC 7541 5.1: ``value`` in a ``prefix_bits`` prefix, ``first`` the high bits."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(data: bytes) -> bytes:
    """RFC 7541 5.2, no Huffman: encoding is a copy, and peers decode either."""
    return encode_integer(len(data), 7, 0) + data


def encode_headers(headers: Sequence[tuple[bytes, bytes]]) -> bytes:
    """One header block: a static-table index where name and value match exactly,
    else a literal without indexing (the name indexed when the static table has it)."""
    out = bytearray()
    for name, value in headers:
        exact = _EXACT.get((name, value))
        if exact is not None:
            out += encode_integer(exact, 7, 0x80)
            continue
        named = _NAME.get(name)
        if named is not None:
            out += encode_integer(named, 4, 0x00)
        else:
            out += b"\x00" + _string(name)
        out += _string(value)
    return bytes(out)


def table_size_update(size: int) -> bytes:
    """RFC 7541 6.3: the dynamic table size update that must open our next block
    after the peer lowers SETTINGS_HEADER_TABLE_SIZE. nghttp2's decoder insists on
    it, even from an encoder that never indexes: without it every request of
    ``h2load --header-table-size=0`` fails."""
    return encode_integer(size, 5, 0x20)


#: The headers of every successful gRPC answer.
RESPONSE_GRPC: bytes = encode_headers(
    [(b":status", b"200"), (b"content-type", b"application/grpc")]
)
#: The trailers of a successful gRPC answer.
TRAILERS_OK: bytes = encode_headers([(b"grpc-status", b"0")])
