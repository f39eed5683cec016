"""The server side of one HTTP/2 connection (RFC 9113), sans-IO and hardened.

``receive(data, now)`` parses the peer's bytes into events and never raises
on peer input; the ``send_*`` methods queue our frames; ``data_to_send()``
takes everything queued, in order, for one write. The clock is an argument
(``now``, seconds), used only by the rapid-reset budget.

Connection errors (GOAWAY with the code, a :class:`ConnectionTerminated`
event, every later input ignored):

- PROTOCOL_ERROR: a preface other than ``PRI * HTTP/2.0...`` or a first frame
  other than SETTINGS; a frame on the wrong stream (DATA, HEADERS, PRIORITY,
  RST_STREAM, CONTINUATION on 0; SETTINGS, PING, GOAWAY off 0); an even or
  decreasing new stream id; a frame other than PRIORITY on an idle stream
  (even ids are idle for good: we never push);
  PUSH_PROMISE (clients never push); CONTINUATION anywhere but right after
  its HEADERS; padding longer than the payload; bad SETTINGS values
  (ENABLE_PUSH not 0/1, MAX_FRAME_SIZE outside [2^14, 2^24-1]); a
  WINDOW_UPDATE of 0 on the connection.
- FRAME_SIZE_ERROR: a frame longer than our SETTINGS_MAX_FRAME_SIZE (checked
  on its 9-byte header, before its payload is buffered); SETTINGS not a
  multiple of 6 or an ACK with a payload; PING not 8 bytes; RST_STREAM and
  WINDOW_UPDATE not 4; PRIORITY not 5 (the RFC allows a stream error: the
  connection error is simpler and the frame is never sent by gRPC clients);
  GOAWAY under 8.
- FLOW_CONTROL_ERROR: DATA beyond our connection or stream window; a send
  window pushed past 2^31-1 by a WINDOW_UPDATE on 0 or by INITIAL_WINDOW_SIZE
  (which itself must not exceed 2^31-1).
- COMPRESSION_ERROR: a header block hpack cannot decode, or whose decoded list
  exceeds four times our SETTINGS_MAX_HEADER_LIST_SIZE (hpack stops mid-block,
  so its dynamic table no longer matches the peer's: the connection cannot go on).
  Four times the default is 64 KiB, above Envoy's own 60 KiB request header
  limit: a request Envoy forwards costs at most its stream, never the
  connection (the calls of every other client behind that Envoy).
- STREAM_CLOSED: HEADERS or DATA on a stream that is closed and forgotten;
  HEADERS with an id not above the highest seen is on a closed stream too
  (RFC 9113 5.1.1: opening a stream closes the idle ones below it).
- INTERNAL_ERROR: a bug of ours met while parsing; it ends that connection,
  never the server (``receive`` does not raise).
- ENHANCE_YOUR_CALM: floods. A header block (HEADERS + CONTINUATION) over
  ``max_header_block_bytes`` compressed (CONTINUATION flood, CVE-2024-27316);
  more than ``max_settings_entries`` settings in one SETTINGS frame
  (CVE-2020-11080); more than ``max_empty_frames`` consecutive empty
  DATA/HEADERS/CONTINUATION frames without END_STREAM (CVE-2019-9518);
  PRIORITY frames over ``max_priority_frames_per_stream`` x (1 + streams
  opened) (Envoy's formula, CVE-2019-9513); WINDOW_UPDATEs over 5 + 2 x
  (streams opened + ``max_window_updates_per_data_frame`` x DATA frames
  sent) (Envoy's formula; CVE-2019-9511, -9517); control frames we owe
  the peer (PING and SETTINGS ACKs, RST_STREAMs its frames caused) over
  ``max_outbound_control_frames`` before ``data_to_send`` takes them
  (CVE-2019-9512, -9515); the rapid-reset budget exhausted (CVE-2023-44487).

Stream errors (RST_STREAM, a :class:`StreamReset` event if the application
knew the stream; the connection lives on; each charged to the rapid-reset
budget, since a peer can make us reset as cheaply as it resets):

- PROTOCOL_ERROR: a malformed request (:mod:`.request_headers`), a body
  longer or shorter than its content-length (RFC 9113 8.1.1), trailers
  without END_STREAM or with pseudo-headers, a PRIORITY frame making a stream
  depend on itself (in HEADERS that is a connection error: simpler, and no
  gRPC client sends priorities), a WINDOW_UPDATE of 0 on a stream.
- ENHANCE_YOUR_CALM: a header list over SETTINGS_MAX_HEADER_LIST_SIZE (RFC
  9113 10.5.1; the block is still decoded so HPACK stays in sync), a body
  over ``max_body_bytes``, or DATA that takes the bodies of the connection's
  open streams together over ``max_connection_body_bytes`` (that stream is
  reset, the others go on): gRPC clients report RESOURCE_EXHAUSTED.
- STREAM_CLOSED: DATA or HEADERS after the peer's END_STREAM.
- FLOW_CONTROL_ERROR: a stream's send window pushed past 2^31-1.
- REFUSED_STREAM: a new stream over ``max_concurrent_streams`` or after the
  peer's GOAWAY (safe for the client to retry elsewhere).

Choices the RFC leaves open:

- Unknown frame types are ignored and not counted as empty frames: they cost
  what their bytes cost, like any frame, and make us do no stream work.
  Padding-only DATA counts as empty (it carries nothing either).
- Request trailers are decoded, checked and dropped; the end of the request
  reaches the application as ``DataReceived(stream, b"", True)`` (gRPC clients
  send none).
- After ``start_drain`` new streams are ignored, never reset (RFC 9113 6.8:
  their ids exceed the GOAWAY's last stream id), their header blocks still
  decoded.
- Frames on a stream we reset are ignored (RFC 9113 5.4.2) while it is among
  the last ``2 x max_concurrent_streams + 64`` streams we reset; after that,
  DATA or HEADERS on it are STREAM_CLOSED.

Flow control. Our receive windows are ``stream_window`` (advertised) and
``connection_window`` (one WINDOW_UPDATE at start). Request bytes handed to
the application come back as window credit only through ``acknowledge``, or
when their stream closes, so the bytes the application holds per connection
never exceed ``connection_window``; bytes we discard (padding, frames on reset
or closed streams) are credited back without waiting for the application.
Credit goes out (from ``data_to_send``, or ``acknowledge`` for a stream) once
half a window is owed or the peer has less than half of it left: a busy
connection sends few WINDOW_UPDATEs, and a peer never waits on credit we
owe. Our window grows only as the update goes out, so a peer is held to
exactly what we advertised. Our send side honours the peer's MAX_FRAME_SIZE,
INITIAL_WINDOW_SIZE (its deltas apply to open streams, RFC 9113 6.9.2) and
WINDOW_UPDATEs; what they refuse waits in a per-stream queue (trailers queued
behind it keep their order) and goes out when windows open. The queue holds
whatever the application sends: ``queued_bytes`` is the adapter's to bound
(it stops reading requests while the queue is above its high-water mark, so
no new answers join it).

Buffering: ``receive`` keeps at most one incomplete frame (its length was
checked against ``max_frame_size`` first) plus the bytes it was given.

HPACK: requests are decoded with ``hpack.Decoder`` behind a per-connection
cache from block bytes to the decoded, validated headers: sound because it
only keeps blocks whose decoding left the dynamic table as it found it (size
limit, length and newest entry object unchanged; every insertion puts a new
tuple first), so such a block decodes to the same headers while the table is
unchanged, and it is emptied whenever a block changes the table. Bounded by
``header_cache_bytes`` (keys + values); full, it is emptied and refilled, so
blocks a peer stops sending do not pin it.
"""

from __future__ import annotations

import struct
from collections import deque
from typing import NamedTuple

import hpack

from meshplane.servers.h2.http2.hpack_blocks import table_size_update
from meshplane.servers.h2.http2.limits import (
    DEFAULT_LIMITS,
    DEFAULT_WINDOW,
    MAX_MAX_FRAME_SIZE,
    MAX_WINDOW,
    MIN_MAX_FRAME_SIZE,
    Limits,
)
from meshplane.servers.h2.http2.request_headers import (
    NO_LENGTH,
    content_length,
    request_error,
    trailers_error,
)

Headers = list[tuple[bytes, bytes]]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types (RFC 9113 6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
# Flags.
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
_BLOCK_FLAGS = END_HEADERS | PADDED | PRIORITY_FLAG
# Error codes (RFC 9113 7).
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
SETTINGS_TIMEOUT, STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM = 0x4, 0x5, 0x6, 0x7
CANCEL, COMPRESSION_ERROR, CONNECT_ERROR, ENHANCE_YOUR_CALM = 0x8, 0x9, 0xA, 0xB
INADEQUATE_SECURITY, HTTP_1_1_REQUIRED = 0xC, 0xD
# Settings (RFC 9113 6.5.2).
SETTINGS_HEADER_TABLE_SIZE, SETTINGS_ENABLE_PUSH, SETTINGS_MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE, SETTINGS_MAX_HEADER_LIST_SIZE = 4, 5, 6
#: The HPACK dynamic table size we allow the peer (the RFC default; not advertised).
HEADER_TABLE_SIZE = 4096

_HEADER = struct.Struct(">BHBBI")  # length (24 bits as 8 + 16), type, flags, stream id
_pack = _HEADER.pack
_SETTING = struct.Struct(">HI")
_U32 = struct.Struct(">I")
_GOAWAY = struct.Struct(">II")


class RequestReceived(NamedTuple):
    """A new request's headers (``ended``: HEADERS carried END_STREAM, no body).

    The headers are validated (:mod:`.request_headers`), in the order sent. A
    block the header cache knows gives the *same* list object every time: never
    change it (it is the cache's); an adapter may key its own per-block work
    (a request scope, say) on that identity while it holds the list.
    """

    stream_id: int
    headers: Headers
    ended: bool


class DataReceived(NamedTuple):
    """Request body bytes; ``ended`` on the last (possibly empty) piece."""

    stream_id: int
    data: bytes
    ended: bool


class StreamReset(NamedTuple):
    """The peer reset the stream, or we did for a stream error: forget it."""

    stream_id: int
    code: int


class ConnectionTerminated(NamedTuple):
    """GOAWAY sent (a connection error) or received; ``reason`` never holds peer bytes.

    After ours, :attr:`Connection.terminated` is true: write what ``data_to_send``
    holds (the GOAWAY) and close. After the peer's, the connection still serves
    the streams it has (new ones are refused): close once ``active_streams`` is 0.
    """

    code: int
    reason: str


Event = RequestReceived | DataReceived | StreamReset | ConnectionTerminated
#: A NamedTuple built without its Python-level ``__new__``: half the cost, on the hot path.
_new = tuple.__new__


def frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    """One frame: the 9-byte header, then the payload."""
    n = len(payload)
    return _pack(n >> 16, n & 0xFFFF, kind, flags, stream_id) + payload


class _ConnectionError(Exception):
    """Raised inside ``receive`` to end the connection with a GOAWAY."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code, self.reason = code, reason


class _Stream:
    """One open or half-closed stream."""

    __slots__ = (
        "answered",
        "body",
        "length",
        "limit",
        "local_open",
        "owed",
        "pending",
        "recv_window",
        "remote_open",
        "send_window",
        "unacked",
    )

    def __init__(self, recv_window: int, send_window: int, remote_open: bool, limit: int) -> None:
        self.recv_window = recv_window  # what the peer may still send us
        self.send_window = send_window  # what we may still send the peer
        self.remote_open = remote_open  # the peer has not sent END_STREAM
        self.local_open = True  # we have not sent END_STREAM
        self.answered = False  # we sent HEADERS (a reset after it is no rapid reset)
        self.body = 0  # request DATA bytes received
        self.length = NO_LENGTH  # the request's content-length
        self.limit = limit  # the body may not exceed it (max_body_bytes, content-length)
        self.unacked = 0  # bytes handed to the application, not acknowledged
        self.owed = 0  # stream credit acknowledged, not yet sent
        # Frames the peer's windows held back: (DATA payload or header block, is_data, end).
        self.pending: deque[tuple[bytes, bool, bool]] | None = None


class Connection:
    """The server side of one HTTP/2 connection (see the module docstring)."""

    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        self.limits = limits
        self._buf = b""
        self._preface = False  # the preface has arrived
        self._settled = False  # the peer's first SETTINGS has arrived
        self._terminated = False
        self._draining = False  # we sent GOAWAY(NO_ERROR): new streams ignored
        self._peer_goaway = False  # the peer sent GOAWAY: new streams refused
        self._streams: dict[int, _Stream] = {}
        self._highest = 0  # the highest stream id the peer used
        self._opened = 0  # streams the peer opened (flood budgets scale with it)
        self._reset: dict[int, None] = {}  # recently reset by us: their frames ignored
        self._reset_keep = 2 * limits.max_concurrent_streams + 64
        # Limits read per frame, as plain attributes (one lookup, not two).
        self._max_frame = limits.max_frame_size
        self._max_streams = limits.max_concurrent_streams
        self._max_control = limits.max_outbound_control_frames
        self._max_body = limits.max_body_bytes
        self._max_held = limits.max_connection_body_bytes
        self._held = 0  # request DATA bytes of the open streams (see _forget)
        self._stream_window = limits.stream_window
        self._half_window = limits.connection_window >> 1
        # Inbound.
        self._recv_window = limits.connection_window  # connection: what the peer may send
        self._conn_owed = 0  # connection credit due back, not yet sent
        self._empty = 0  # consecutive empty frames
        self._priority_frames = 0
        self._window_updates = 0
        self._continuing = 0  # the stream whose header block awaits CONTINUATION
        self._cont_end = False  # that block's HEADERS carried END_STREAM
        self._cont_block = bytearray()
        self._tokens = float(limits.reset_budget.burst)
        self._tokens_at: float | None = None
        # HPACK.
        self._decoder = hpack.Decoder(max_header_list_size=4 * limits.max_header_list_bytes)
        self._decoder.max_allowed_table_size = HEADER_TABLE_SIZE
        self._cache: dict[bytes, tuple[Headers, int]] = {}  # block -> headers, content-length
        self._cache_used = 0
        self._mark = self._table_mark()
        self._fresh = False  # the last decoding left the dynamic table unchanged
        # Outbound.
        self._out: list[bytes] = []
        self._control = 0  # peer-caused control frames in _out
        self._send_window = DEFAULT_WINDOW  # the peer's connection window for our DATA
        self._peer_initial = DEFAULT_WINDOW
        self._peer_max_frame = MIN_MAX_FRAME_SIZE
        self._hpack_prefix = b""  # a table size update owed to the peer's decoder
        self._peer_table_size = HEADER_TABLE_SIZE
        self._blocked: dict[int, None] = {}  # streams with pending frames, oldest first
        self._queued = 0
        self._data_frames = 0  # DATA frames sent (the WINDOW_UPDATE budget)
        settings = b"".join(
            _SETTING.pack(key, value)
            for key, value in (
                (SETTINGS_ENABLE_PUSH, 0),
                (SETTINGS_MAX_CONCURRENT_STREAMS, limits.max_concurrent_streams),
                (SETTINGS_INITIAL_WINDOW_SIZE, limits.stream_window),
                (SETTINGS_MAX_FRAME_SIZE, limits.max_frame_size),
                (SETTINGS_MAX_HEADER_LIST_SIZE, limits.max_header_list_bytes),
            )
        )
        self._out.append(frame(SETTINGS, 0, 0, settings))
        if limits.connection_window > DEFAULT_WINDOW:
            increment = limits.connection_window - DEFAULT_WINDOW
            self._out.append(frame(WINDOW_UPDATE, 0, 0, _U32.pack(increment)))

    # -- properties ---------------------------------------------------------------

    @property
    def active_streams(self) -> int:
        """Open or half-closed streams (a drain ends when this reaches 0)."""
        return len(self._streams)

    @property
    def queued_bytes(self) -> int:
        """Response bytes held back by the peer's flow control."""
        return self._queued

    @property
    def held_bytes(self) -> int:
        """Request DATA bytes of the open streams (the application holds them until
        the stream closes): what the adapter's worker-wide budget counts."""
        return self._held

    def stream_queued_bytes(self, stream_id: int) -> int:
        """Response bytes of one stream held back by the peer's flow control."""
        stream = self._streams.get(stream_id)
        if stream is None or not stream.pending:
            return 0
        return sum(len(item[0]) for item in stream.pending)

    @property
    def data_frames_sent(self) -> int:
        """DATA frames queued so far: the adapter's sign that a held queue still moves."""
        return self._data_frames

    @property
    def terminated(self) -> bool:
        """GOAWAY for an error or ``close`` was queued: no more input is read."""
        return self._terminated

    # For the adapter's handshake and slow-peer (slowloris) timeouts, which need the
    # clock this core does not read.

    @property
    def settled(self) -> bool:
        """The preface and the peer's first SETTINGS have arrived."""
        return self._settled

    @property
    def buffered_bytes(self) -> int:
        """Input held for want of the rest: part of the preface or of one frame."""
        return len(self._buf)

    @property
    def awaiting_continuation(self) -> bool:
        """A header block was begun and awaits its CONTINUATION frames."""
        return self._continuing != 0

    # -- input --------------------------------------------------------------------

    def receive(self, data: bytes, now: float) -> list[Event]:
        """Parse ``data`` (``bytes``, as ``data_received`` gets them) at time ``now``;
        the events it completes, in order. Never raises on peer input."""
        events: list[Event] = []
        if self._terminated:
            return events
        buf = self._buf + data if self._buf else data
        pos = 0
        try:
            if not self._preface:
                if len(buf) < len(PREFACE):
                    if not PREFACE.startswith(buf):
                        raise _ConnectionError(PROTOCOL_ERROR, "bad connection preface")
                    self._buf = buf
                    return events
                if buf[: len(PREFACE)] != PREFACE:
                    raise _ConnectionError(PROTOCOL_ERROR, "bad connection preface")
                self._preface, pos = True, len(PREFACE)
            end = len(buf)
            max_frame = self._max_frame
            unpack = _HEADER.unpack_from
            while end - pos >= 9:
                high, low, kind, flags, stream_id = unpack(buf, pos)
                length = (high << 16) | low
                if length > max_frame:
                    raise _ConnectionError(FRAME_SIZE_ERROR, "frame larger than MAX_FRAME_SIZE")
                if end - pos - 9 < length:
                    break
                payload = buf[pos + 9 : pos + 9 + length]
                pos += 9 + length
                stream_id &= 0x7FFFFFFF
                if self._continuing and kind != CONTINUATION:
                    raise _ConnectionError(PROTOCOL_ERROR, "header block interrupted")
                if not self._settled and kind != SETTINGS:
                    raise _ConnectionError(PROTOCOL_ERROR, "first frame is not SETTINGS")
                if kind == DATA:
                    self._data(stream_id, flags, payload, events, now)
                elif kind == HEADERS:
                    if flags & _BLOCK_FLAGS == END_HEADERS and stream_id and payload:
                        self._empty = 0  # the common case: one frame, no padding or priority
                        self._header_block(stream_id, payload, flags & END_STREAM, events, now)
                    else:
                        self._headers(stream_id, flags, payload, events, now)
                else:
                    self._other(kind, stream_id, flags, payload, events=events, now=now)
            self._buf = buf[pos:] if pos < end else b""
        except _ConnectionError as error:
            self._fail(error.code, error.reason, events)
            return events
        except Exception:  # a bug of ours: end this connection, not the server
            self._fail(INTERNAL_ERROR, "internal error", events)
            return events
        return events

    def _fail(self, code: int, reason: str, events: list[Event]) -> None:
        self._terminated = True
        self._buf = b""
        self._drop_queues()
        self._out.append(frame(GOAWAY, 0, 0, _GOAWAY.pack(self._highest, code)))
        events.append(ConnectionTerminated(code, reason))

    def _data(
        self, stream_id: int, flags: int, payload: bytes, events: list[Event], now: float
    ) -> None:
        length = len(payload)
        if length > self._recv_window:
            raise _ConnectionError(FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        self._recv_window -= length
        data = payload
        if flags & PADDED:
            if not length or payload[0] >= length:
                raise _ConnectionError(PROTOCOL_ERROR, "padding longer than DATA")
            data = payload[1 : length - payload[0]]
        ended = flags & END_STREAM
        if not data and not ended:
            self._empty += 1
            if self._empty > self.limits.max_empty_frames:
                raise _ConnectionError(ENHANCE_YOUR_CALM, "empty frame flood")
        else:
            self._empty = 0
        stream = self._streams.get(stream_id)
        if stream is None or not stream.remote_open:
            self._credit(length)  # discarded: the connection credit goes back at once
            if stream is not None:
                self._stream_error(stream_id, STREAM_CLOSED, events, now)
            elif stream_id > self._highest or not stream_id & 1:  # idle (we never push)
                raise _ConnectionError(PROTOCOL_ERROR, "DATA on an idle stream")
            elif stream_id not in self._reset:
                raise _ConnectionError(STREAM_CLOSED, "DATA on a closed stream")
            return
        if length > stream.recv_window:
            raise _ConnectionError(FLOW_CONTROL_ERROR, "DATA beyond the stream window")
        stream.recv_window -= length
        size = len(data)
        if length != size:  # padding: credit it back at once
            self._credit(length - size)
            if not ended:
                self._stream_credit(stream_id, stream, length - size)
        stream.body += size
        self._held += size
        if stream.body > stream.limit or self._held > self._max_held:
            self._credit(size)
            # More than content-length is malformed (RFC 9113 8.1.1); else over our caps.
            code = PROTOCOL_ERROR if stream.body > stream.length >= 0 else ENHANCE_YOUR_CALM
            self._stream_error(stream_id, code, events, now)
            return
        stream.unacked += size
        if ended:
            if stream.length > stream.body:  # less than content-length: malformed
                self._stream_error(stream_id, PROTOCOL_ERROR, events, now)
                return
            stream.remote_open = False
            if not stream.local_open:
                self._close_stream(stream_id, stream)
        if size or ended:
            events.append(_new(DataReceived, (stream_id, data, bool(ended))))

    def _headers(
        self, stream_id: int, flags: int, payload: bytes, events: list[Event], now: float
    ) -> None:
        if stream_id == 0:
            raise _ConnectionError(PROTOCOL_ERROR, "HEADERS on stream 0")
        block = payload
        if flags & (PADDED | PRIORITY_FLAG):
            start, stop = 0, len(payload)
            if flags & PADDED:
                if not stop:
                    raise _ConnectionError(PROTOCOL_ERROR, "padding longer than HEADERS")
                start, stop = 1, stop - payload[0]
            depends = 0
            if flags & PRIORITY_FLAG:
                if stop - start < 5:
                    raise _ConnectionError(PROTOCOL_ERROR, "padding longer than HEADERS")
                depends = _U32.unpack_from(payload, start)[0] & 0x7FFFFFFF
                start += 5
            if stop < start:
                raise _ConnectionError(PROTOCOL_ERROR, "padding longer than HEADERS")
            block = payload[start:stop]
            if depends == stream_id:  # RFC 9113 5.3.1; see the module docstring
                raise _ConnectionError(PROTOCOL_ERROR, "stream depends on itself")
        if not block and not flags & END_STREAM:
            self._empty += 1
            if self._empty > self.limits.max_empty_frames:
                raise _ConnectionError(ENHANCE_YOUR_CALM, "empty frame flood")
        else:
            self._empty = 0
        if not flags & END_HEADERS:
            if len(block) > self.limits.max_header_block_bytes:
                raise _ConnectionError(ENHANCE_YOUR_CALM, "header block too large")
            self._continuing = stream_id
            self._cont_end = bool(flags & END_STREAM)
            self._cont_block = bytearray(block)
            return
        self._header_block(stream_id, block, flags & END_STREAM, events, now)

    def _header_block(
        self, stream_id: int, block: bytes, ended: int, events: list[Event], now: float
    ) -> None:
        stream = self._streams.get(stream_id)
        if stream is not None:  # trailers
            headers = self._decode(block)
            if not stream.remote_open:
                self._stream_error(stream_id, STREAM_CLOSED, events, now)
            elif not ended or trailers_error(headers) or stream.length > stream.body:
                self._stream_error(stream_id, PROTOCOL_ERROR, events, now)
            else:
                stream.remote_open = False
                if not stream.local_open:
                    self._close_stream(stream_id, stream)
                events.append(DataReceived(stream_id, b"", True))
            return
        if not stream_id & 1:
            raise _ConnectionError(PROTOCOL_ERROR, "even stream id from a client")
        if stream_id <= self._highest:
            if stream_id in self._reset:
                self._decode(block)
                return
            raise _ConnectionError(STREAM_CLOSED, "HEADERS on a closed stream")
        self._highest = stream_id
        self._opened += 1
        if self._draining:  # above our GOAWAY's last stream: ignored, and so are its frames
            if block not in self._cache:  # a cached block leaves the table as it is
                self._decode(block)
            self._note_reset(stream_id)
            return
        cached = self._cache.get(block)
        if cached is not None:
            headers, length = cached  # the same list each time: see RequestReceived
        else:
            headers = self._decode(block)
            code = request_error(headers, self.limits.max_header_list_bytes)
            if code:
                self._stream_error(stream_id, code, events, now)
                return
            length = content_length(headers)
            self._remember(block, headers, length)
        if ended and length > 0:  # RFC 9113 8.1.1: the body must match content-length
            self._stream_error(stream_id, PROTOCOL_ERROR, events, now)
            return
        if self._peer_goaway or len(self._streams) >= self._max_streams:
            self._stream_error(stream_id, REFUSED_STREAM, events, now)
            return
        stream = _Stream(self._stream_window, self._peer_initial, not ended, self._max_body)
        if length != NO_LENGTH:
            stream.length = length
            stream.limit = min(length, self._max_body)
        self._streams[stream_id] = stream
        events.append(_new(RequestReceived, (stream_id, headers, bool(ended))))

    def _continuation(
        self, stream_id: int, flags: int, payload: bytes, events: list[Event], now: float
    ) -> None:
        if not self._continuing or stream_id != self._continuing:
            raise _ConnectionError(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        block = self._cont_block
        block += payload
        if len(block) > self.limits.max_header_block_bytes:
            raise _ConnectionError(ENHANCE_YOUR_CALM, "header block too large")
        if not payload and not flags & END_HEADERS:
            self._empty += 1
            if self._empty > self.limits.max_empty_frames:
                raise _ConnectionError(ENHANCE_YOUR_CALM, "empty frame flood")
        else:
            self._empty = 0
        if flags & END_HEADERS:
            self._continuing = 0
            self._cont_block = bytearray()
            self._header_block(stream_id, bytes(block), int(self._cont_end), events, now)

    # -- HPACK --------------------------------------------------------------------

    def _table_mark(self) -> tuple[int, int, object]:
        table = self._decoder.header_table
        entries = table.dynamic_entries
        return table.maxsize, len(entries), entries[0] if entries else None

    def _decode(self, block: bytes) -> Headers:
        """Decode with hpack; empty the cache when the block changed the dynamic table."""
        try:
            headers: Headers = list(self._decoder.decode(block, raw=True))
        except hpack.OversizedHeaderListError as exc:
            raise _ConnectionError(COMPRESSION_ERROR, "header list far too large") from exc
        except Exception as exc:  # hpack's errors, and its helpers' on truncated input
            raise _ConnectionError(COMPRESSION_ERROR, "header block does not decode") from exc
        mark = self._table_mark()
        old = self._mark
        if mark[0] != old[0] or mark[1] != old[1] or mark[2] is not old[2]:
            self._cache.clear()
            self._cache_used = 0
            self._mark = mark
            self._fresh = False
        else:
            self._fresh = True
        return headers

    def _remember(self, block: bytes, headers: Headers, length: int) -> None:
        """Cache a validated request block, if its decoding left the table unchanged."""
        if not self._fresh:
            return
        size = len(block) + sum(len(name) + len(value) for name, value in headers)
        limit = self.limits.header_cache_bytes
        if size > limit:
            return
        if self._cache_used + size > limit:
            self._cache.clear()
            self._cache_used = 0
        self._cache[block] = (headers, length)
        self._cache_used += size

    # -- control frames -------------------------------------------------------------

    def _other(
        self,
        kind: int,
        stream_id: int,
        flags: int,
        payload: bytes,
        *,
        events: list[Event],
        now: float,
    ) -> None:
        if kind == CONTINUATION:
            self._continuation(stream_id, flags, payload, events, now)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload, events, now)
        elif kind == SETTINGS:
            self._settings(stream_id, flags, payload)
        elif kind == PING:
            if stream_id:
                raise _ConnectionError(PROTOCOL_ERROR, "PING on a stream")
            if len(payload) != 8:
                raise _ConnectionError(FRAME_SIZE_ERROR, "PING not 8 bytes")
            if not flags & ACK:
                self._owe_control(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            self._rst_stream(stream_id, payload, events, now)
        elif kind == PRIORITY:
            self._priority(stream_id, payload, events, now)
        elif kind == GOAWAY:
            if stream_id:
                raise _ConnectionError(PROTOCOL_ERROR, "GOAWAY on a stream")
            if len(payload) < 8:
                raise _ConnectionError(FRAME_SIZE_ERROR, "GOAWAY under 8 bytes")
            code = _GOAWAY.unpack_from(payload)[1]
            if not self._peer_goaway:
                self._peer_goaway = True
                events.append(ConnectionTerminated(code, f"peer sent GOAWAY (code {code})"))
        elif kind == PUSH_PROMISE:
            raise _ConnectionError(PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        # Unknown frame types: ignored (RFC 9113 4.1).

    def _settings(self, stream_id: int, flags: int, payload: bytes) -> None:
        if stream_id:
            raise _ConnectionError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise _ConnectionError(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            if not self._settled:
                raise _ConnectionError(PROTOCOL_ERROR, "first frame is not SETTINGS")
            return
        if len(payload) % 6:
            raise _ConnectionError(FRAME_SIZE_ERROR, "SETTINGS not a multiple of 6 bytes")
        if len(payload) > 6 * self.limits.max_settings_entries:
            raise _ConnectionError(ENHANCE_YOUR_CALM, "too many settings in one frame")
        self._settled = True
        initial = self._peer_initial
        for offset in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, offset)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE too large")
                initial = value
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not MIN_MAX_FRAME_SIZE <= value <= MAX_MAX_FRAME_SIZE:
                    raise _ConnectionError(PROTOCOL_ERROR, "MAX_FRAME_SIZE out of range")
                self._peer_max_frame = value
            elif key == SETTINGS_ENABLE_PUSH:
                if value > 1:
                    raise _ConnectionError(PROTOCOL_ERROR, "ENABLE_PUSH not 0 or 1")
            elif key == SETTINGS_HEADER_TABLE_SIZE and value < self._peer_table_size:
                # Our blocks never index, but a decoder whose table shrank expects the
                # size update at the start of our next block (RFC 7541 4.2).
                self._peer_table_size = value
                self._hpack_prefix = table_size_update(value)
        self._owe_control(frame(SETTINGS, ACK, 0, b""))
        # The window change applies to every open stream (RFC 9113 6.9.2), once per
        # frame with its last value: repeated entries cost nothing more.
        delta = initial - self._peer_initial
        if delta:
            self._peer_initial = initial
            for stream in self._streams.values():
                stream.send_window += delta
                if stream.send_window > MAX_WINDOW:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, "stream window overflow")
            if delta > 0:
                self._pump()

    def _window_update(
        self, stream_id: int, payload: bytes, events: list[Event], now: float
    ) -> None:
        if len(payload) != 4:
            raise _ConnectionError(FRAME_SIZE_ERROR, "WINDOW_UPDATE not 4 bytes")
        self._window_updates += 1
        allowed = 5 + 2 * (
            self._opened + self.limits.max_window_updates_per_data_frame * self._data_frames
        )
        if self._window_updates > allowed:
            raise _ConnectionError(ENHANCE_YOUR_CALM, "WINDOW_UPDATE flood")
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if not stream_id:
            if not increment:
                raise _ConnectionError(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > MAX_WINDOW:
                raise _ConnectionError(FLOW_CONTROL_ERROR, "connection window overflow")
            self._pump()
            return
        stream = self._streams.get(stream_id)
        if stream is None:
            if stream_id > self._highest or not stream_id & 1:
                raise _ConnectionError(PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
            return  # closed: a WINDOW_UPDATE in flight is normal
        if not increment:
            self._stream_error(stream_id, PROTOCOL_ERROR, events, now)
            return
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            self._stream_error(stream_id, FLOW_CONTROL_ERROR, events, now)
            return
        if stream.pending:
            self._pump()

    def _rst_stream(self, stream_id: int, payload: bytes, events: list[Event], now: float) -> None:
        if len(payload) != 4:
            raise _ConnectionError(FRAME_SIZE_ERROR, "RST_STREAM not 4 bytes")
        if stream_id > self._highest or not stream_id & 1:
            raise _ConnectionError(PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        stream = self._streams.pop(stream_id, None)
        if stream is None:
            return
        self._forget(stream_id, stream)
        events.append(StreamReset(stream_id, _U32.unpack(payload)[0]))
        if not stream.answered:
            self._charge_reset(now)

    def _priority(self, stream_id: int, payload: bytes, events: list[Event], now: float) -> None:
        if not stream_id:
            raise _ConnectionError(PROTOCOL_ERROR, "PRIORITY on stream 0")
        if len(payload) != 5:
            raise _ConnectionError(FRAME_SIZE_ERROR, "PRIORITY not 5 bytes")
        self._priority_frames += 1
        if self._priority_frames > self.limits.max_priority_frames_per_stream * (1 + self._opened):
            raise _ConnectionError(ENHANCE_YOUR_CALM, "PRIORITY flood")
        if _U32.unpack_from(payload)[0] & 0x7FFFFFFF == stream_id:
            if stream_id > self._highest or not stream_id & 1:  # no RST_STREAM when idle
                raise _ConnectionError(PROTOCOL_ERROR, "stream depends on itself")
            self._stream_error(stream_id, PROTOCOL_ERROR, events, now)

    # -- stream bookkeeping -----------------------------------------------------------

    def _charge_reset(self, now: float) -> None:
        budget = self.limits.reset_budget
        if self._tokens_at is not None and now > self._tokens_at:
            self._tokens = min(
                float(budget.burst), self._tokens + (now - self._tokens_at) * budget.per_second
            )
            self._tokens_at = now
        elif self._tokens_at is None:
            self._tokens_at = now
        if self._tokens < 1:
            raise _ConnectionError(ENHANCE_YOUR_CALM, "too many streams reset")
        self._tokens -= 1

    def _stream_error(self, stream_id: int, code: int, events: list[Event], now: float) -> None:
        """RST_STREAM for the peer's fault: counted as a control frame and a reset."""
        stream = self._streams.pop(stream_id, None)
        if stream is not None:
            self._forget(stream_id, stream)
            events.append(StreamReset(stream_id, code))
        self._note_reset(stream_id)
        self._owe_control(frame(RST_STREAM, 0, stream_id, _U32.pack(code)))
        if stream is None or not stream.answered:
            self._charge_reset(now)

    def _owe_control(self, control: bytes) -> None:
        """Queue a control frame the peer's frame calls for, within the budget of those
        not yet taken by ``data_to_send`` (a peer that does not read is cut off)."""
        self._control += 1
        if self._control > self._max_control:
            raise _ConnectionError(ENHANCE_YOUR_CALM, "outbound control frame flood")
        self._out.append(control)

    def _note_reset(self, stream_id: int) -> None:
        reset = self._reset
        reset[stream_id] = None
        if len(reset) > self._reset_keep:
            del reset[next(iter(reset))]

    def _forget(self, stream_id: int, stream: _Stream) -> None:
        """A stream ends (reset or closed): its queue goes, its held bytes' credit returns,
        its body leaves the connection's count."""
        self._held -= stream.body
        if stream.unacked:
            self._credit(stream.unacked)
            stream.unacked = 0
        if stream.pending:
            self._queued -= sum(len(item[0]) for item in stream.pending)
            stream.pending = None
        self._blocked.pop(stream_id, None)

    def _close_stream(self, stream_id: int, stream: _Stream) -> None:
        del self._streams[stream_id]
        if stream.pending is not None:
            self._forget(stream_id, stream)
        else:  # the common case, inline: _forget's bookkeeping without a queue
            self._held -= stream.body
            if stream.unacked:  # credit for what the request held
                self._conn_owed += stream.unacked

    def _credit(self, size: int) -> None:
        """Connection credit due back (sent by ``data_to_send``, see ``_flush_credit``)."""
        self._conn_owed += size

    def _flush_credit(self) -> None:
        """The connection WINDOW_UPDATE, once half the window is owed or the peer has
        less than half left: few updates on a busy connection, and a peer is never
        held up by credit we owe. Our window grows only as the update goes out."""
        owed = self._conn_owed
        half = self._half_window
        if owed >= half or self._recv_window < half:
            self._recv_window += owed
            self._conn_owed = 0
            self._out.append(frame(WINDOW_UPDATE, 0, 0, _U32.pack(owed)))

    def _stream_credit(self, stream_id: int, stream: _Stream, size: int) -> None:
        """Stream credit, by the same rule as the connection's."""
        owed = stream.owed + size
        half = self.limits.stream_window >> 1
        if owed >= half or stream.recv_window < half:
            stream.recv_window += owed
            stream.owed = 0
            self._out.append(frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(owed)))
        else:
            stream.owed = owed

    def _drop_queues(self) -> None:
        """The connection is over: no stream can progress, nothing waits to be sent."""
        self._streams.clear()
        self._blocked.clear()
        self._queued = 0
        self._held = 0
        self._conn_owed = 0

    # -- output -------------------------------------------------------------------

    def send_headers(self, stream_id: int, block: bytes, *, end_stream: bool = False) -> None:
        """Queue an HPACK-encoded header block (response headers or trailers).

        Ignored for a stream that is gone (reset by either side, or closed): the
        application learns of resets from :class:`StreamReset` and may race them.
        """
        stream = self._streams.get(stream_id)  # none once terminated: streams are dropped
        if stream is None or not stream.local_open:
            return
        stream.answered = True
        if stream.pending:
            stream.pending.append((block, False, end_stream))
            self._queued += len(block)
            if end_stream:
                stream.local_open = False
            return
        n = len(block)
        if n > self._peer_max_frame or self._hpack_prefix:
            self._emit_headers(stream_id, stream, block, end_stream)
            return
        if end_stream:  # the common case, inline: one frame
            self._out.append(
                _pack(n >> 16, n & 0xFFFF, HEADERS, END_HEADERS | END_STREAM, stream_id) + block
            )
            stream.local_open = False
            if not stream.remote_open:
                self._close_stream(stream_id, stream)
        else:
            self._out.append(_pack(n >> 16, n & 0xFFFF, HEADERS, END_HEADERS, stream_id) + block)

    def _emit_headers(self, stream_id: int, stream: _Stream, block: bytes, end: bool) -> None:
        if self._hpack_prefix:
            block = self._hpack_prefix + block
            self._hpack_prefix = b""
        flags = END_STREAM if end else 0
        step = self._peer_max_frame
        if len(block) <= step:
            self._out.append(frame(HEADERS, flags | END_HEADERS, stream_id, block))
        else:
            self._out.append(frame(HEADERS, flags, stream_id, block[:step]))
            for i in range(step, len(block), step):
                last = END_HEADERS if i + step >= len(block) else 0
                self._out.append(frame(CONTINUATION, last, stream_id, block[i : i + step]))
        if end:
            stream.local_open = False
            if not stream.remote_open:
                self._close_stream(stream_id, stream)

    def send_data(self, stream_id: int, data: bytes, *, end_stream: bool = False) -> None:
        """Queue response body bytes, within the peer's windows; the rest waits for them.

        Ignored for a stream that is gone (see :meth:`send_headers`).
        """
        stream = self._streams.get(stream_id)  # none once terminated: streams are dropped
        if stream is None or not stream.local_open:
            return
        size = len(data)
        if (
            stream.pending is None
            and size <= self._peer_max_frame
            and size <= self._send_window
            and size <= stream.send_window
        ):  # the common case, inline: one frame within the windows
            self._out.append(
                _pack(size >> 16, size & 0xFFFF, DATA, END_STREAM if end_stream else 0, stream_id)
                + data
            )
            self._data_frames += 1
            self._send_window -= size
            stream.send_window -= size
            if end_stream:
                stream.local_open = False
                if not stream.remote_open:
                    self._close_stream(stream_id, stream)
            return
        if stream.pending:
            stream.pending.append((data, True, end_stream))
            self._queued += len(data)
            if end_stream:
                stream.local_open = False
            return
        sent = self._emit_data(stream_id, stream, data, end_stream)
        if sent < len(data):
            rest = data[sent:]
            stream.pending = deque(((rest, True, end_stream),))
            self._queued += len(rest)
            self._blocked[stream_id] = None
            if end_stream:
                stream.local_open = False

    def _emit_data(self, stream_id: int, stream: _Stream, data: bytes, end: bool) -> int:
        """Frame as much of ``data`` as the windows allow; the bytes sent."""
        size = len(data)
        room = max(0, min(self._send_window, stream.send_window, size))
        if size and not room:
            return 0
        step = self._peer_max_frame
        out = self._out
        if room == size and size <= step:  # the common case: one frame
            out.append(frame(DATA, END_STREAM if end else 0, stream_id, data))
            self._data_frames += 1
        else:
            for i in range(0, room, step):
                chunk = data[i : min(i + step, room)]
                last = end and i + step >= room and room == size
                out.append(frame(DATA, END_STREAM if last else 0, stream_id, chunk))
                self._data_frames += 1
        self._send_window -= room
        stream.send_window -= room
        if end and room == size:
            stream.local_open = False
            if not stream.remote_open:
                self._close_stream(stream_id, stream)
        return room

    def _pump(self) -> None:
        """Send what waits on the peer's windows, oldest stream first."""
        for stream_id in list(self._blocked):
            if self._send_window <= 0:
                return
            stream = self._streams.get(stream_id)
            pending = stream.pending if stream is not None else None
            if stream is None or pending is None:
                self._blocked.pop(stream_id, None)
                continue
            while pending:
                item, is_data, end = pending.popleft()
                self._queued -= len(item)
                if not is_data:
                    self._emit_headers(stream_id, stream, item, end)
                    continue
                sent = self._emit_data(stream_id, stream, item, end)
                if sent < len(item):
                    pending.appendleft((item[sent:], True, end))
                    self._queued += len(item) - sent
                    break
            if not pending:
                stream.pending = None
                self._blocked.pop(stream_id, None)

    def reset_stream(self, stream_id: int, code: int) -> None:
        """RST_STREAM from the application (e.g. a handler's deadline): forget the stream."""
        stream = self._streams.pop(stream_id, None)
        if stream is None or self._terminated:
            return
        self._forget(stream_id, stream)
        self._note_reset(stream_id)
        self._out.append(frame(RST_STREAM, 0, stream_id, _U32.pack(code)))

    def acknowledge(self, stream_id: int, size: int) -> None:
        """The application consumed ``size`` body bytes of the stream: give the window back.

        Acknowledge as bytes are taken off the connection (into a message buffer
        bounded by ``max_body_bytes``, say), not only once a whole body is in: the
        requests of one connection together may exceed ``connection_window``, and
        a peer whose window is full sends nothing more. A stream's unacknowledged
        bytes are credited when it closes; more than it holds is clamped. The
        WINDOW_UPDATE goes out through ``data_to_send``.
        """
        stream = self._streams.get(stream_id)
        if stream is None or size <= 0:
            return
        size = min(size, stream.unacked)
        if not size:
            return
        stream.unacked -= size
        self._credit(size)
        if stream.remote_open:
            self._stream_credit(stream_id, stream, size)

    def start_drain(self) -> None:
        """GOAWAY(NO_ERROR, the highest stream seen): streams above it are ignored."""
        if self._draining or self._terminated:
            return
        self._draining = True
        self._out.append(frame(GOAWAY, 0, 0, _GOAWAY.pack(self._highest, NO_ERROR)))

    def close(self, code: int, reason: str) -> None:
        """GOAWAY(code) and terminate: no more input is read, nothing more is sent."""
        if self._terminated:
            return
        self._terminated = True
        self._drop_queues()
        self._out.append(frame(GOAWAY, 0, 0, _GOAWAY.pack(self._highest, code)))

    def data_to_send(self) -> bytes:
        """Everything queued for the wire, in order; the outbound control count restarts."""
        if self._conn_owed and (
            self._conn_owed >= self._half_window or self._recv_window < self._half_window
        ):
            self._flush_credit()
        out = self._out
        if not out:
            return b""
        self._control = 0
        data = b"".join(out)
        out.clear()
        return data
