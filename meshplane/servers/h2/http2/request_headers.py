"""Is a decoded request header list well-formed (RFC 9113 8.2, 8.3)?

A malformed request is a stream error (RST_STREAM PROTOCOL_ERROR, RFC 9113
8.1.1): the connection, and every other call on it, lives on. What we refuse:

- field names that are not lowercase tokens (8.2.1: uppercase, controls,
  space, DEL and non-ASCII; a colon only as a pseudo-header's first byte);
- values with NUL, CR or LF, or with leading/trailing space or tab (8.2.1);
- pseudo-headers after a regular field, twice, unknown, or a response one
  (``:status``) (8.3); a request without exactly one non-empty ``:method``,
  ``:scheme`` and ``:path``. CONNECT (8.5) is therefore refused too: a gRPC
  server has no use for tunnels;
- connection-specific fields (8.2.2): ``connection``, ``keep-alive``,
  ``proxy-connection``, ``transfer-encoding``, ``upgrade``, and ``te`` other
  than ``trailers``;
- a ``content-length`` that is not one decimal number (RFC 9110 8.6; the
  connection also holds the body to it, RFC 9113 8.1.1);
- a list whose RFC 7541 size (name + value + 32 per field) exceeds our
  advertised SETTINGS_MAX_HEADER_LIST_SIZE (RFC 9113 10.5.1); that one is
  answered ENHANCE_YOUR_CALM (gRPC clients report RESOURCE_EXHAUSTED).

Only blocks that pass are kept in the connection's header-block cache, so a
cached block is never checked twice.
"""

from __future__ import annotations

import re

PROTOCOL_ERROR = 0x1
ENHANCE_YOUR_CALM = 0xB

_BAD_NAME = re.compile(rb"[\x00-\x20A-Z\x7f-\xff:]")
_BAD_VALUE = re.compile(rb"[\x00\r\n]|^[ \t]|[ \t]$")
_REQUIRED = frozenset((b":method", b":scheme", b":path"))
_PSEUDO = _REQUIRED | {b":authority"}
_CONNECTION_SPECIFIC = frozenset(
    (b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade")
)


def request_error(headers: list[tuple[bytes, bytes]], max_list_bytes: int) -> int:
    """The RST_STREAM code the request deserves, 0 when it is well-formed."""
    if content_length(headers) == BAD_LENGTH:
        return PROTOCOL_ERROR
    seen: set[bytes] = set()
    regular = False
    size = 0
    for name, value in headers:
        size += len(name) + len(value) + 32
        if name[:1] == b":":
            if regular or name not in _PSEUDO or name in seen:
                return PROTOCOL_ERROR
            seen.add(name)
            if name in _REQUIRED and not value:
                return PROTOCOL_ERROR
        else:
            regular = True
            if not name or _BAD_NAME.search(name) is not None:
                return PROTOCOL_ERROR
            if name in _CONNECTION_SPECIFIC or (name == b"te" and value != b"trailers"):
                return PROTOCOL_ERROR
        if _BAD_VALUE.search(value) is not None:
            return PROTOCOL_ERROR
    if not seen >= _REQUIRED:
        return PROTOCOL_ERROR
    if size > max_list_bytes:
        return ENHANCE_YOUR_CALM
    return 0


#: ``content_length``'s answers that are not a length.
NO_LENGTH, BAD_LENGTH = -1, -2


def content_length(headers: list[tuple[bytes, bytes]]) -> int:
    """The declared body length, ``NO_LENGTH`` without one, ``BAD_LENGTH`` for one that is
    not a decimal number or several that differ (RFC 9110 8.6)."""
    length = NO_LENGTH
    for name, value in headers:
        if name == b"content-length":
            if not value.isdigit() or len(value) > 18:
                return BAD_LENGTH
            if length != NO_LENGTH and int(value) != length:
                return BAD_LENGTH
            length = int(value)
    return length


def trailers_error(headers: list[tuple[bytes, bytes]]) -> int:
    """Request trailers (RFC 9113 8.1): no pseudo-header, names and values as above."""
    for name, value in headers:
        if not name or _BAD_NAME.search(name) is not None:
            return PROTOCOL_ERROR
        if name in _CONNECTION_SPECIFIC or _BAD_VALUE.search(value) is not None:
            return PROTOCOL_ERROR
    return 0
