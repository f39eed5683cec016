"""The h2 backend's connection: asyncio (uvloop) sockets to the pure HTTP/2 core, streams to ASGI.

One :class:`H2Protocol` per accepted connection owns one
:class:`meshplane.servers.h2.http2.Connection` (the sans-IO state machine that
enforces every protocol rule and hostile-peer limit) and feeds it the bytes
it reads with the loop's clock (the core never reads a clock). Each request
stream becomes one ASGI call of the app (the worker passes
:class:`meshplane.asgi_grpc.GrpcAsgiApp`, so gRPC framing, deadlines,
health, reflection and tracing metadata are the Envoy backend's, unchanged):

- scope: ``type http``, ``http_version "2"``, method, scheme, path (decoded),
  raw_path, query_string, the regular headers (pseudo-headers are in the
  scope's own keys), server, client, and the ``http.response.trailers``
  extension;
- ``receive()`` yields the body as ``http.request`` chunks (everything that
  arrived so far in one message, so a unary request that came in one read
  is one chunk) and gives the bytes' window credit back to the peer as the
  app takes them (so what a slow app has not taken is bounded by the core's
  windows); ``http.disconnect`` once the stream is reset or the connection
  is gone;
- ``send()``: ``http.response.start`` is held until the body, so that a start
  followed by an empty final body and no trailers is gRPC's Trailers-Only
  answer, one HEADERS frame with END_STREAM; otherwise HEADERS, DATA and
  the trailers' HEADERS. Header blocks are HPACK-encoded once per distinct
  header list (the app reuses the same few) and never touch the peer's
  dynamic table (:mod:`meshplane.servers.h2.http2.hpack_blocks`). A body message with
  more to come waits while the transport is paused or the answers queued
  behind the peer's windows pass ``max_stream_queued_bytes`` on the stream or
  ``max_queued_response_bytes`` on the connection; on a reset stream ``send``
  raises ``ConnectionResetError`` (and the handler's task is cancelled), so a
  streaming handler stops working for a peer that left.

A request whose body came whole goes to the app's entry for complete unary
calls (``GrpcAsgiApp.complete_unary``: the same call, answered in one
``respond`` instead of ASGI messages) if it has one and the request is a plain
unary call; everything else goes through ASGI as above.

The calls a read started run in one asyncio task, in order (``_drain``): a
call that finishes without suspending costs no task of its own; one that
suspends keeps that task for itself (the app's ``grpc-timeout`` deadlines
cancel ``current_task()``; a stream the peer resets cancels its task, as
grpcio cancels a handler) and the calls after it go on in a new drain. What
the calls and the core produce is written in one ``transport.write`` per loop
iteration at most: a flush is scheduled with ``call_soon`` behind the drain a
read started, so the answers of every request of a read go out together.

Protections that need time or the socket, and so live here, not in the core
(defaults in :class:`H2Settings`, each with why):

- the client's connection preface and first SETTINGS must arrive within
  ``handshake_seconds`` (TLS handshakes have the same bound, given to the
  event loop);
- a connection with no open stream for ``idle_seconds`` gets GOAWAY(NO_ERROR)
  and is closed;
- a peer that leaves a frame unfinished (no byte of it taken for
  ``frame_seconds``: a slow but progressing upload is fine) or a header
  block unfinished for ``frame_seconds`` (slowloris) is closed with GOAWAY;
- a peer that does not read: when the transport's buffer passes its high
  mark (``pause_writing``) we stop reading from it (no new requests, no new
  control-frame answers, nothing more queued) until it drains; if it stays
  stuck ``send_stall_seconds``, the connection is aborted;
- a peer that reads but withholds WINDOW_UPDATEs: once the core holds more
  than ``max_queued_response_bytes`` of answers its flow control refuses,
  new requests wait instead of running (reading goes on, since the peer's
  WINDOW_UPDATE arrives on the read side; pausing reading would deadlock a
  peer that waits for its data before it sends one), and run as the queue
  drains; the requests waiting are bounded by the core's stream limits.
  Answers already running still join the queue (128 x 4 MiB, measured), so
  a queue that does not move for ``send_stall_seconds`` (no DATA frame goes
  out while answers wait: the peer keeps its windows shut) ends the
  connection with GOAWAY(ENHANCE_YOUR_CALM), as a peer that does not read;
- a connection older than ``max_age_seconds`` gets GOAWAY (clients reconnect,
  which evens out SO_REUSEPORT's split between workers) and is closed
  ``max_age_grace_seconds`` later if calls are still open;
- at most ``max_connections`` connections per worker: more are closed at
  once (the kernel's backlog and the other workers take the load);
- the worker's buffer budget, ``max_buffered_bytes``: request bytes held by
  open streams plus answer bytes queued, over every connection (each charges
  its own at each read and flush; a large answer at once). At or above it,
  new streams are refused (REFUSED_STREAM); above it, the connection holding
  the most is cut off (GOAWAY ENHANCE_YOUR_CALM, its handlers cancelled at
  once). This, not the connection cap, bounds a worker's memory.

Which timeout fires is decided by :func:`timeout_verdict`, pure (the loop's
clock is its argument) and table-tested; the protocol keeps one timer per
connection, re-armed lazily from that verdict, so a call costs no timer work.

Counts (connections, streams, resets and terminations by error code) go to
an :class:`H2Stats` of plain integers; the worker turns them into metrics
(a prometheus_client write per stream would cost more than the stream).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
import math
import types
from collections.abc import Coroutine, Generator
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, cast
from urllib.parse import unquote

from meshplane.server_contract import ASGIApp, CompleteUnaryEntry
from meshplane.servers.h2.http2 import connection as h2c
from meshplane.servers.h2.http2.connection import (
    CANCEL,
    ENHANCE_YOUR_CALM,
    INTERNAL_ERROR,
    NO_ERROR,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    Connection,
    ConnectionTerminated,
    DataReceived,
    Headers,
    RequestReceived,
    StreamReset,
)
from meshplane.servers.h2.http2.hpack_blocks import encode_headers
from meshplane.servers.h2.http2.limits import DEFAULT_LIMITS, Limits

log = logging.getLogger(__name__)

Message = dict[str, Any]


@dataclass(frozen=True, slots=True)
class H2Settings:
    """The h2 backend's per-worker settings (the protocol limits are :class:`Limits`)."""

    limits: Limits = DEFAULT_LIMITS
    #: Preface + first SETTINGS (and the TLS handshake): a real client sends them
    #: with its first bytes; 10 s covers a slow network without letting idle
    #: sockets hold a connection slot.
    handshake_seconds: float = 10.0
    #: A connection without an open stream this long is closed (GOAWAY NO_ERROR):
    #: Envoy and gRPC clients keep connections for reuse, so this only trims the
    #: forgotten ones; 5 minutes, well above gRPC's default keepalive.
    idle_seconds: float = 300.0
    #: A frame or header block unfinished this long is a slowloris: a real peer
    #: sends a frame in one go (the core's limits bound the frame's size).
    frame_seconds: float = 30.0
    #: The peer has not read what we wrote (transport paused), or has kept the
    #: flow-control windows our answers wait on shut, this long: gone or hostile;
    #: its connection is aborted (or closed, with GOAWAY, when it still reads).
    send_stall_seconds: float = 60.0
    #: A connection this old gets GOAWAY(NO_ERROR) and the client opens a new one,
    #: as grpcio's ``max_connection_age`` and Envoy's ``max_connection_duration``
    #: (10 minutes, as the other backends): SO_REUSEPORT balances by connection,
    #: so recycling evens out an uneven first split between workers.
    max_age_seconds: float = 600.0
    #: After that GOAWAY, the calls still open (a Watch) get this long, then the
    #: connection closes (grpcio's ``max_connection_age_grace``).
    max_age_grace_seconds: float = 30.0
    #: Connections per worker; beyond, new ones are closed at once: bounds the
    #: sockets and per-connection state (file descriptors, HPACK tables, timers),
    #: far above what a sidecar fleet opens. Not memory: each connection may hold
    #: 16 MiB of request bodies and 16 MiB of answers, so what bounds a worker's
    #: memory is ``max_buffered_bytes``.
    max_connections: int = 10_000
    #: Answers held back by the peer's flow control above this on one connection:
    #: new requests wait, and a handler's ``send`` waits. Four default gRPC messages.
    max_queued_response_bytes: int = 16 * 1024 * 1024
    #: Answers held back on one stream above this: its handler's ``send`` waits
    #: (a streaming handler, such as reflection answering pipelined requests,
    #: cannot queue without end behind a peer that keeps its window shut).
    max_stream_queued_bytes: int = 1024 * 1024
    #: The worker's budget: request bytes its connections hold (open streams'
    #: bodies) plus answer bytes they queue. At or above it, new streams are
    #: refused (REFUSED_STREAM, which gRPC clients retry); above it, the
    #: connection holding the most is cut off (GOAWAY ENHANCE_YOUR_CALM) until
    #: the total is under it again. 64 MiB: sixteen full gRPC messages at once;
    #: a worker's resident memory stays within about three times this above its
    #: idle size (the bytes, their copies on the way, the allocator's slack).
    max_buffered_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in (
            "handshake_seconds",
            "idle_seconds",
            "frame_seconds",
            "send_stall_seconds",
            "max_age_seconds",
            "max_age_grace_seconds",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        if self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        for name in (
            "max_queued_response_bytes",
            "max_stream_queued_bytes",
            "max_buffered_bytes",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")


#: The name of every HTTP/2 error code (RFC 9113 section 7; the values are the
#: core's): the label values of the counts.
ERROR_NAMES: dict[int, str] = {
    getattr(h2c, name): name
    for name in (
        "NO_ERROR",
        "PROTOCOL_ERROR",
        "INTERNAL_ERROR",
        "FLOW_CONTROL_ERROR",
        "SETTINGS_TIMEOUT",
        "STREAM_CLOSED",
        "FRAME_SIZE_ERROR",
        "REFUSED_STREAM",
        "CANCEL",
        "COMPRESSION_ERROR",
        "CONNECT_ERROR",
        "ENHANCE_YOUR_CALM",
        "INADEQUATE_SECURITY",
        "HTTP_1_1_REQUIRED",
    )
}


@dataclass
class H2Stats:
    """What the worker's connections counted since the last :meth:`take` (plain ints:
    the hot path pays an attribute increment, not a metrics write)."""

    connections_opened: int = 0
    connections_refused: int = 0
    streams: int = 0
    #: Streams reset (by the peer or by us), by error code.
    resets: collections.Counter[int] = field(default_factory=collections.Counter)
    #: Connections ended by a GOAWAY (sent or received) or a timeout, by error code.
    terminations: collections.Counter[int] = field(default_factory=collections.Counter)

    def take(self) -> H2Stats:
        """The counts so far, and zero here."""
        out = H2Stats(
            self.connections_opened,
            self.connections_refused,
            self.streams,
            self.resets,
            self.terminations,
        )
        self.connections_opened = self.connections_refused = self.streams = 0
        self.resets = collections.Counter()
        self.terminations = collections.Counter()
        return out


class ConnectionSet:
    """The open connections of one worker: the cap, the buffer budget, the drain."""

    def __init__(self, app: ASGIApp, settings: H2Settings, stats: H2Stats) -> None:
        self.app = app
        self.settings = settings
        self.stats = stats
        self.open: set[H2Protocol] = set()
        self.draining = False
        #: Request and answer bytes the connections hold (each charges its own).
        self.buffered = 0
        self.budget = settings.max_buffered_bytes
        #: The most ``buffered`` reached since the allocator last gave memory back.
        self.buffered_peak = 0
        self._all_closed: asyncio.Event | None = None

    def give_back(self) -> bool:
        """Once most of a large peak of buffered bytes is released: True, and the
        peak restarts (the caller returns the allocator's free pages to the
        system, :func:`meshplane.worker_support.trim_heap`)."""
        if self.buffered_peak >= self.budget // 4 and self.buffered < self.buffered_peak // 4:
            self.buffered_peak = self.buffered
            return True
        return False

    def over_budget(self) -> None:
        """Past the budget: the biggest holders are cut off until it holds again.

        The biggest, not the one whose bytes crossed the line: a peer that holds
        much is the likely attacker, and a small call that arrives at the wrong
        moment keeps its connection. A scan of the open connections, paid only
        past the budget.
        """
        while self.buffered > self.budget:
            holders = [proto for proto in self.open if proto.charged]
            if not holders:
                return
            max(holders, key=lambda proto: proto.charged).cut_off()

    def protocol(self) -> H2Protocol:
        """The protocol factory of ``loop.create_server``."""
        return H2Protocol(self)

    def start_drain(self) -> None:
        """GOAWAY on every connection: their open calls finish, new streams are refused."""
        self.draining = True
        for proto in list(self.open):
            proto.start_drain()

    def close_all(self) -> None:
        """End every connection now (the drain's grace is over)."""
        for proto in list(self.open):
            proto.close(NO_ERROR, "server stopping")

    def closed(self, proto: H2Protocol) -> None:
        """A connection is gone (its ``connection_lost``)."""
        self.open.discard(proto)
        if not self.open and self._all_closed is not None:
            self._all_closed.set()

    async def wait_closed(self) -> None:
        """Until every connection is gone (their last bytes written)."""
        if self.open:
            self._all_closed = asyncio.Event()
            await self._all_closed.wait()


_DISCONNECT: Message = {"type": "http.disconnect"}
_EMPTY_REQUEST: Message = {"type": "http.request", "body": b"", "more_body": False}
_TRAILERS_EXTENSION: dict[str, Any] = {"http.response.trailers": {}}

# Encoded response header blocks, by (status, header tuple): the app sends the same
# few lists (its OK start and trailers, a few statuses); bounded since messages vary.
_BLOCKS: dict[tuple[int, tuple[tuple[bytes, bytes], ...]], bytes] = {}
_MAX_BLOCKS = 512
# The last few message objects seen and their blocks, by identity (the app reuses
# its constant dicts): a dict lookup by id instead of building a key. The object is
# held in the value, so its id cannot be reused while it is here.
_BY_OBJECT: dict[int, tuple[Message, bytes]] = {}
_MAX_BY_OBJECT = 64
#: Scopes kept per connection (one per distinct request header list).
_MAX_SCOPES = 64
_STATUS_TEXT = {status: str(status).encode() for status in range(100, 600)}
#: An answer this big is charged to the worker's budget at once, not at the flush:
#: the calls of one read run back to back, and each could add as much.
_ACCOUNT_NOW = 64 * 1024


def _block_of(message: Message, status: int | None) -> bytes:
    """The HPACK block of a start (``status`` given) or trailers message.

    Looked up by the message object first: the app sends the same constant
    dicts on every call (never mutated: a dict changed after its first use
    would keep its first block), then by content.
    """
    known = _BY_OBJECT.get(id(message))
    if known is not None and known[0] is message:
        return known[1]
    headers = tuple((bytes(name).lower(), bytes(value)) for name, value in message["headers"])
    key = (status or 0, headers)
    block = _BLOCKS.get(key)
    if block is None:
        if len(_BLOCKS) >= _MAX_BLOCKS:
            _BLOCKS.clear()
        listed: list[tuple[bytes, bytes]] = list(headers)
        if status is not None:
            listed.insert(0, (b":status", _STATUS_TEXT.get(status) or str(status).encode()))
        block = _BLOCKS[key] = encode_headers(listed)
    if len(_BY_OBJECT) >= _MAX_BY_OBJECT:
        _BY_OBJECT.clear()
    _BY_OBJECT[id(message)] = (message, block)
    return block


class _Stream:
    """One request stream: its scope, the body not yet taken, the response state."""

    __slots__ = (
        "chunks",
        "done",
        "drained",
        "end_delivered",
        "ended",
        "finished",
        "proto",
        "reset",
        "scope",
        "start",
        "stream_id",
        "task",
        "trailers",
        "waiter",
    )

    def __init__(self, proto: H2Protocol, stream_id: int, scope: dict[str, Any]) -> None:
        self.proto = proto
        self.stream_id = stream_id
        self.scope = scope
        self.chunks: list[bytes] = []
        self.ended = False  # the request's END_STREAM arrived
        self.end_delivered = False  # and the app was told (more_body False)
        self.reset = False  # reset by either side, or the connection is gone
        self.finished = False  # our END_STREAM was queued
        self.done = False  # the app returned
        self.start: bytes | None = None  # the held response HEADERS block
        self.trailers = False  # the start announced trailers
        self.waiter: asyncio.Future[None] | None = None
        self.drained: asyncio.Future[None] | None = None  # a send waiting on the queues
        self.task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def wake_sender(self) -> None:
        drained = self.drained
        if drained is not None:
            self.drained = None
            if not drained.done():
                drained.set_result(None)

    async def receive(self) -> Message:
        while True:
            chunks = self.chunks
            if chunks:
                body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                chunks.clear()
                if not self.reset:
                    self.proto.acknowledge(self.stream_id, len(body))
                self.end_delivered = self.ended
                return {"type": "http.request", "body": body, "more_body": not self.ended}
            if self.ended and not self.end_delivered:
                self.end_delivered = True
                return _EMPTY_REQUEST
            if self.reset or (self.finished and self.end_delivered):
                return _DISCONNECT  # reset, or the exchange is over both ways
            # Nothing yet (or everything taken): wait for data, the end, or a reset.
            waiter = self.waiter = self.proto.loop.create_future()
            await waiter

    def respond(self, start: Message, body: bytes, trailers: Message | None) -> None:
        """A whole answer at once (:class:`meshplane.server_contract.UnaryResponder`):
        what ``send`` makes of start, one final body and trailers (or of a start
        and an empty final body, Trailers-Only), without the three messages."""
        if self.reset or self.finished:
            return  # the client is gone: nobody to tell
        proto = self.proto
        conn = proto.conn
        stream_id = self.stream_id
        if trailers is None:
            conn.send_headers(stream_id, _block_of(start, int(start["status"])), end_stream=True)
        else:
            conn.send_headers(stream_id, _block_of(start, int(start["status"])))
            conn.send_data(stream_id, body)
            conn.send_headers(stream_id, _block_of(trailers, None), end_stream=True)
            if conn.queued_bytes > proto.max_queued:
                proto.hold_requests()
            if len(body) > _ACCOUNT_NOW:
                proto.account()  # before the read's next call makes another
        self.finished = True
        proto.schedule_flush()

    async def send(self, message: Message) -> None:
        if self.reset:
            # ASGI's rule for a send after the disconnect: a handler that streams
            # (reflection, Watch) stops here instead of working for nobody.
            raise ConnectionResetError("the stream was reset")
        if self.finished:
            return  # the answer is over: nothing more to send
        kind = message["type"]
        proto = self.proto
        conn = proto.conn
        if kind == "http.response.body":
            body = message.get("body", b"")
            more = message.get("more_body", False)
            last = not more and not self.trailers
            start = self.start
            if start is not None:
                self.start = None
                if last and not body:  # Trailers-Only: one HEADERS frame
                    conn.send_headers(self.stream_id, start, end_stream=True)
                    self.finished = True
                    proto.schedule_flush()
                    return
                conn.send_headers(self.stream_id, start)
            if body or last:
                conn.send_data(self.stream_id, bytes(body), end_stream=last)
                self.finished = last
                if body and conn.queued_bytes > proto.max_queued:
                    proto.hold_requests()
                if len(body) > _ACCOUNT_NOW:
                    proto.account()  # before the read's next call makes another
                if more and proto.must_wait(self):
                    proto.schedule_flush()
                    await proto.writable(self)
                    return
        elif kind == "http.response.start":
            self.start = _block_of(message, int(message["status"]))
            self.trailers = bool(message.get("trailers", False))
            return  # sent with the first body message
        elif kind == "http.response.trailers":
            if message.get("more_trailers", False):
                raise RuntimeError("trailers in several messages are not supported")
            if self.start is not None:  # no body message at all: send the start first
                conn.send_headers(self.stream_id, self.start)
                self.start = None
            conn.send_headers(self.stream_id, _block_of(message, None), end_stream=True)
            self.finished = True
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
        proto.schedule_flush()


class H2Protocol(asyncio.Protocol):
    """One HTTP/2 connection (see the module docstring)."""

    def __init__(self, owner: ConnectionSet) -> None:
        self.owner = owner
        settings = owner.settings
        self.settings = settings
        self.max_queued = settings.max_queued_response_bytes
        self.max_stream_queued = settings.max_stream_queued_bytes
        #: The bytes this connection holds, as charged to the worker's budget.
        self.charged = 0
        self._senders: list[_Stream] = []  # streams whose send waits on the queues
        self.loop = asyncio.get_running_loop()
        self.conn = Connection(settings.limits)
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, _Stream] = {}
        self._held: collections.deque[_Stream] = collections.deque()
        self._holding = False
        self._app = owner.app
        # The app's entry for complete unary calls (GrpcAsgiApp has one), if any.
        self._complete: CompleteUnaryEntry | None = getattr(owner.app, "complete_unary", None)
        self._stats = owner.stats
        self._flush_scheduled = False
        self._write_paused_at: float | None = None
        self._draining = False
        self._closing = False
        self._handshaken = False
        self._opened_at = 0.0
        self._idle_since = 0.0
        self._partial_since: float | None = None  # a frame unfinished since (progress resets)
        self._buffered = 0  # the bytes of that frame the core holds
        self._block_since: float | None = None  # a header block unfinished since
        self._window_stall_since: float | None = None  # answers queued, none moving, since
        self._window_stall_sent = 0  # the core's DATA frame count then
        self._timer: asyncio.TimerHandle | None = None
        self._base_scope: dict[str, Any] = {}
        self._scopes: dict[int, tuple[Headers, dict[str, Any]]] = {}
        self._batch: list[_Stream] | None = None  # the requests this read started
        self._context = contextvars.copy_context()

    # ---- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)  # uvloop's: no subclass
        owner = self.owner
        if len(owner.open) >= self.settings.max_connections or owner.draining:
            self._stats.connections_refused += 1
            self._closing = True
            self.transport.abort()
            return
        owner.open.add(self)
        self._stats.connections_opened += 1
        tls = transport.get_extra_info("ssl_object") is not None
        self._base_scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "2",
            "scheme": "https" if tls else "http",
            "root_path": "",
            "server": _address(transport.get_extra_info("sockname")),
            "client": _address(transport.get_extra_info("peername")),
            "extensions": _TRAILERS_EXTENSION,
        }
        now = self.loop.time()
        self._opened_at = self._idle_since = now
        self._flush()  # our SETTINGS first
        self._arm(now + self.settings.handshake_seconds)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._uncharge()
        self.owner.closed(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for stream in list(self.streams.values()):
            self._drop(stream)
        self._held.clear()
        self._senders.clear()
        self.transport = None

    def pause_writing(self) -> None:
        """The peer is not reading: stop reading it until our buffer drains."""
        if self._write_paused_at is None:
            self._write_paused_at = now = self.loop.time()
            if self.transport is not None:
                self.transport.pause_reading()
            self._arm(now + self.settings.send_stall_seconds)

    def resume_writing(self) -> None:
        if self._write_paused_at is not None:
            self._write_paused_at = None
            if self.transport is not None and not self._closing:
                self.transport.resume_reading()
            self.schedule_flush()

    def data_received(self, data: bytes) -> None:
        now = self.loop.time()
        conn = self.conn
        events = conn.receive(data, now)
        try:
            self._events(events)
        except Exception as exc:  # a bug of ours: end this connection, not the worker
            log.exception("HTTP/2 connection failed", extra={"error": type(exc).__name__})
            self.close(INTERNAL_ERROR, "internal error")
            return
        finally:
            self._batch = None  # the next read's requests get a drain of their own
        if not self._handshaken and conn.settled:
            self._handshaken = True
        buffered, continuing = conn.buffered_bytes, conn.awaiting_continuation
        # Slowloris: a frame left unfinished (progress resets the clock: bytes taken
        # from the buffer are complete frames), or a header block left unfinished
        # (its CONTINUATIONs do not reset it).
        if buffered:
            if self._partial_since is None or buffered < self._buffered + len(data):
                self._partial_since = now
                self._arm(now + self.settings.frame_seconds)
        else:
            self._partial_since = None
        self._buffered = buffered
        if continuing:
            if self._block_since is None:
                self._block_since = now
                self._arm(now + self.settings.frame_seconds)
        else:
            self._block_since = None
        if self._holding and conn.queued_bytes <= self.max_queued // 2:
            self._release_held()
        self.account()
        self.schedule_flush()

    def _events(self, events: list[h2c.Event]) -> None:
        conn = self.conn
        for event in events:
            kind = type(event)
            if kind is RequestReceived:
                self._request(cast("RequestReceived", event))
            elif kind is DataReceived:
                stream_id, chunk, ended = cast("DataReceived", event)
                stream = self.streams.get(stream_id)
                if stream is None or stream.reset:
                    if chunk:  # nobody will take it: the window credit goes back now
                        conn.acknowledge(stream_id, len(chunk))
                    continue
                if chunk:
                    stream.chunks.append(chunk)
                if ended:
                    stream.ended = True
                stream.wake()
            elif kind is StreamReset:
                stream_id, code = cast("StreamReset", event)
                self._stats.resets[code] += 1
                stream = self.streams.get(stream_id)
                if stream is not None:
                    self._drop(stream)
            else:
                code, reason = cast("ConnectionTerminated", event)
                self._terminated(code, reason)

    def eof_received(self) -> bool | None:
        return None  # the transport closes; connection_lost cleans up

    # ---- streams -----------------------------------------------------------------------

    def _request(self, event: RequestReceived) -> None:
        stream_id, headers, ended = event
        # The core hands out the same list for a header block it decoded before
        # (its cache): the scope built from it is reused, as the app never
        # changes a scope (GrpcAsgiApp only reads it). Held with the list, so
        # the id cannot be reused while it is here; bounded.
        known = self._scopes.get(id(headers))
        if known is None or known[0] is not headers:
            if len(self._scopes) >= _MAX_SCOPES:
                self._scopes.clear()
            method, raw_path, path, query, regular = _split_request(headers)
            scope = {
                **self._base_scope,
                "method": method,
                "path": path,
                "raw_path": raw_path,
                "query_string": query,
                "headers": regular,
            }
            self._scopes[id(headers)] = (headers, scope)
        else:
            scope = known[1]
        if self._closing:
            return  # cut off while this read's events were handled
        if self.owner.buffered >= self.owner.budget:
            # The worker holds its budget: no new work until peers give bytes back
            # (gRPC clients retry a refused stream; it never reached the app).
            self.conn.reset_stream(stream_id, REFUSED_STREAM)
            self._stats.resets[REFUSED_STREAM] += 1
            return
        stream = _Stream(self, stream_id, scope)
        stream.ended = ended
        self.streams[stream_id] = stream
        self._stats.streams += 1
        if self._holding:
            self._held.append(stream)
            return
        batch = self._batch
        if batch is None:
            # The first request of this read: one task runs the read's calls (see
            # _drain), scheduled before the read's flush.
            batch = self._batch = []
            self.loop.create_task(self._drain(batch))
        batch.append(stream)

    async def _drain(self, batch: list[_Stream]) -> None:
        """Run the calls a read started, in order, in this one task.

        A task per call cost ~1.1 µs of CPU on uvloop (Python 3.11 has no eager
        tasks), a tenth of a call. Each call's coroutine is started here by hand;
        one that finishes without suspending (a Check) needs no task of its own.
        One that suspends keeps this task for itself (so its ``grpc-timeout``,
        which cancels ``current_task()``, and a reset, which cancels
        ``stream.task``, reach it and only it), and the calls after it go on in
        a new drain, so none waits behind it. A stream reset before its turn is
        skipped, as a cancelled task would never have started.
        """
        for index, stream in enumerate(batch):
            if stream.reset:
                continue
            if self._holding:  # the calls before filled the queue: the rest wait too
                self._held.extend(batch[index:])
                return
            call = self._call(stream)
            try:
                awaited = call.send(None)
            except StopIteration:
                continue
            stream.task = asyncio.current_task(self.loop)
            rest = batch[index + 1 :]
            if rest:
                # From the connection's context, not this call's (which may hold
                # what the call set, such as its trace headers).
                self._context.run(self.loop.create_task, self._drain(rest))
            await _resume(call, awaited)
            return

    async def _call(self, stream: _Stream) -> None:
        try:
            complete = self._complete
            if complete is not None and stream.ended and not stream.reset:
                # The whole request is here (it came in the read that started this
                # task): the app's entry without ASGI messages, if it is a plain
                # unary call.
                chunks = stream.chunks
                body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                scope = stream.scope
                call = complete(scope["method"], scope["path"], scope["headers"], body, stream)
                if call is not None:
                    chunks.clear()
                    stream.end_delivered = True
                    if body:
                        self.acknowledge(stream.stream_id, len(body))
                    await call
                    return
            await self._app(stream.scope, stream.receive, stream.send)
        except asyncio.CancelledError:
            pass  # the stream was reset or the connection is gone
        except Exception as exc:
            log.exception("HTTP/2 stream failed", extra={"error": type(exc).__name__})
        finally:
            stream.done = True
            self._finished(stream)

    def _finished(self, stream: _Stream) -> None:
        """The app returned: a stream it left unanswered is reset; its unread body's
        window credit goes back."""
        if self.streams.get(stream.stream_id) is stream:
            del self.streams[stream.stream_id]
        if not stream.reset and not self._closing:
            if not stream.finished:
                self.conn.reset_stream(stream.stream_id, INTERNAL_ERROR)
            unread = sum(map(len, stream.chunks))
            if unread:
                self.conn.acknowledge(stream.stream_id, unread)
            stream.chunks.clear()
            self.schedule_flush()
        if not self.streams:
            self._idle_since = self.loop.time()
            if self._draining:
                self.schedule_flush()  # closes once written

    def _drop(self, stream: _Stream) -> None:
        """Reset (by either side) or the connection is gone: the app hears
        ``http.disconnect`` and its task is cancelled; its answer is dropped."""
        stream.reset = True
        stream.chunks.clear()
        if self.streams.get(stream.stream_id) is stream:
            del self.streams[stream.stream_id]
        stream.wake()
        stream.wake_sender()
        task = stream.task
        if task is not None and not stream.done:
            task.cancel()
        if not self.streams:
            self._idle_since = self.loop.time()

    def acknowledge(self, stream_id: int, size: int) -> None:
        """The app took ``size`` body bytes: the peer may send as many more."""
        if not self._closing:
            self.conn.acknowledge(stream_id, size)
            self.schedule_flush()

    def must_wait(self, stream: _Stream) -> bool:
        """A streaming handler's next message would queue behind a peer that does
        not take them: the transport is paused, or the connection's or the
        stream's queue is above its mark."""
        conn = self.conn
        return (
            self._write_paused_at is not None
            or conn.queued_bytes > self.max_queued
            or conn.stream_queued_bytes(stream.stream_id) > self.max_stream_queued
        )

    async def writable(self, stream: _Stream) -> None:
        """Until the queues ``stream`` waits on are under their marks again (checked
        at each flush) or the stream is reset (``send`` raises then)."""
        while not stream.reset and self.must_wait(stream):
            if stream.drained is None:
                stream.drained = self.loop.create_future()
                self._senders.append(stream)
            await stream.drained
        if stream.reset:
            raise ConnectionResetError("the stream was reset")

    def _wake_senders(self) -> None:
        waiting = self._senders
        if waiting and self._write_paused_at is None:
            self._senders = []
            for stream in waiting:
                if stream.reset or not self.must_wait(stream):
                    stream.wake_sender()
                else:
                    self._senders.append(stream)

    def account(self) -> None:
        """This connection's bytes to the worker's budget (see ``max_buffered_bytes``)."""
        conn = self.conn
        now = conn.held_bytes + conn.queued_bytes
        delta = now - self.charged
        if delta:
            self.charged = now
            owner = self.owner
            owner.buffered += delta
            if delta > 0:
                owner.buffered_peak = max(owner.buffered_peak, owner.buffered)
                if owner.buffered > owner.budget:
                    owner.over_budget()

    def _uncharge(self) -> None:
        self.owner.buffered -= self.charged
        self.charged = 0

    def cut_off(self) -> None:
        """Past the worker's budget, this connection holds the most: GOAWAY
        (ENHANCE_YOUR_CALM), its streams dropped (their handlers cancelled, their
        bytes released) now, not when the socket is finally gone."""
        self.close(ENHANCE_YOUR_CALM, "the worker's buffer budget is spent")
        for stream in list(self.streams.values()):
            self._drop(stream)
        self._held.clear()
        self._uncharge()

    def hold_requests(self) -> None:
        """Too many answers wait for the peer's window: new requests wait too."""
        self._holding = True

    def _release_held(self) -> None:
        """The queue drained: the waiting requests run, in order, in one drain (which
        holds the rest again if their answers fill the queue anew)."""
        self._holding = False
        waiting = [stream for stream in self._held if not stream.reset]
        self._held.clear()
        if waiting:
            self._context.run(self.loop.create_task, self._drain(waiting))

    # ---- writing and closing -------------------------------------------------------------

    def schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        transport = self.transport
        if transport is None or self._write_paused_at is not None:
            return  # paused: the core keeps it; resume_writing flushes
        conn = self.conn
        self.account()
        data = conn.data_to_send()
        if data:
            transport.write(data)
        if conn.queued_bytes:  # answers wait on the peer's windows: are they moving?
            self._watch_window_stall(conn.data_frames_sent)
        else:
            self._window_stall_since = None
        if self._senders:
            self._wake_senders()
        if conn.terminated or (self._draining and not self.streams):
            self._closing = True
            transport.close()  # after the buffered bytes

    def _watch_window_stall(self, sent: int) -> None:
        """The stall clock starts when answers first wait and restarts whenever a DATA
        frame goes out: only a queue that does not move at all runs it out."""
        if self._window_stall_since is None or sent != self._window_stall_sent:
            self._window_stall_sent = sent
            self._window_stall_since = now = self.loop.time()
            self._arm(now + self.settings.send_stall_seconds)

    def _terminated(self, code: int, reason: str) -> None:
        """GOAWAY sent (a connection error) or received."""
        self._stats.terminations[code] += 1
        if code != NO_ERROR:
            # Debug, not info: a hostile peer could fill the logs one connection at a
            # time; the metrics count every code.
            log.debug("HTTP/2 connection ended", extra={"code": code, "reason": reason})
        # The peer's GOAWAY: its open streams may still finish, then we close.
        self._draining = True

    def start_drain(self) -> None:
        """GOAWAY(NO_ERROR): open streams finish, new ones are refused; closed when idle."""
        if not self._draining and not self._closing:
            self._draining = True
            self.conn.start_drain()
        self.schedule_flush()

    def close(self, code: int, reason: str) -> None:
        """GOAWAY(code) and close once written."""
        if self._closing or self.transport is None:
            return
        if not self.conn.terminated:
            self.conn.close(code, reason)
            self._stats.terminations[code] += 1
        self._closing = True
        if self._write_paused_at is not None:
            # It does not read: a GOAWAY would not get there, and close() would
            # wait for the buffer to drain, holding the socket.
            self.transport.abort()
            return
        data = self.conn.data_to_send()
        if data:
            self.transport.write(data)
        self.transport.close()

    # ---- timeouts ----------------------------------------------------------------------

    def _arm(self, when: float) -> None:
        timer = self._timer
        if timer is not None:
            if timer.when() <= when:
                return  # it fires earlier and re-arms from the state then
            timer.cancel()
        self._timer = self.loop.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        transport = self.transport
        if self._closing or transport is None:
            return
        verdict = timeout_verdict(
            self.loop.time(),
            ConnectionTimes(
                opened_at=self._opened_at,
                handshaken=self._handshaken,
                write_paused_at=self._write_paused_at,
                partial_since=self._partial_since,
                block_since=self._block_since,
                idle_since=None if self.streams else self._idle_since,
                window_stall_since=self._window_stall_since,
            ),
            self.settings,
        )
        if verdict.action == "abort":
            self._stats.terminations[verdict.code] += 1
            self._closing = True
            transport.abort()
        elif verdict.action == "close":
            self.close(verdict.code, verdict.reason)
        else:
            if verdict.action == "drain":
                self.start_drain()
            self._arm(verdict.next_check)


class ConnectionTimes(NamedTuple):
    """When a connection's states began (loop-clock seconds), for :func:`timeout_verdict`."""

    opened_at: float
    #: The preface and first SETTINGS have arrived.
    handshaken: bool
    #: The transport paused our writes (the peer does not read) at; None: writing.
    write_paused_at: float | None
    #: A frame has been unfinished (and not progressing) since; None: none.
    partial_since: float | None
    #: A header block has awaited its end (CONTINUATION) since; None: none.
    block_since: float | None
    #: No stream has been open since; None while one is.
    idle_since: float | None
    #: Answers have waited on the peer's flow-control windows, no DATA frame going
    #: out, since; None: none wait, or they move.
    window_stall_since: float | None = None


class Verdict(NamedTuple):
    """What a connection's timeouts say at ``now``: ``wait`` (look again at
    ``next_check``), ``drain`` (GOAWAY NO_ERROR, then look again), ``close``
    (GOAWAY ``code``) or ``abort`` (the peer does not read: drop the socket)."""

    action: Literal["wait", "drain", "close", "abort"]
    code: int = NO_ERROR
    reason: str = ""
    next_check: float = math.inf


def timeout_verdict(now: float, times: ConnectionTimes, settings: H2Settings) -> Verdict:
    """The first timeout that has passed, in order of how wrong the peer is, or the
    time of the next one (pure: the clock is the caller's)."""
    deadlines = []
    if not times.handshaken:
        due = times.opened_at + settings.handshake_seconds
        if now >= due:
            return Verdict("close", PROTOCOL_ERROR, "no preface within the handshake timeout")
        deadlines.append(due)
    if times.write_paused_at is not None:
        due = times.write_paused_at + settings.send_stall_seconds
        if now >= due:
            return Verdict("abort", CANCEL, "the peer does not read")
        deadlines.append(due)
    if times.window_stall_since is not None:
        due = times.window_stall_since + settings.send_stall_seconds
        if now >= due:
            return Verdict("close", ENHANCE_YOUR_CALM, "the peer keeps its windows shut")
        deadlines.append(due)
    for since in (times.partial_since, times.block_since):
        if since is not None:
            due = since + settings.frame_seconds
            if now >= due:
                return Verdict(
                    "close", ENHANCE_YOUR_CALM, "frame or header block unfinished too long"
                )
            deadlines.append(due)
    age_due = times.opened_at + settings.max_age_seconds
    if now >= age_due + settings.max_age_grace_seconds:
        return Verdict("close", NO_ERROR, "maximum connection age")
    # Answers not yet written are not idleness: the stall timeout governs them.
    if times.idle_since is not None and times.write_paused_at is None:
        due = times.idle_since + settings.idle_seconds
        if now >= due:
            return Verdict("close", NO_ERROR, "idle")
        deadlines.append(due)
    else:
        deadlines.append(now + settings.idle_seconds)  # look again; streams end meanwhile
    if now >= age_due:
        deadlines.append(age_due + settings.max_age_grace_seconds)
        return Verdict("drain", NO_ERROR, "maximum connection age", min(deadlines))
    deadlines.append(age_due)
    return Verdict("wait", next_check=min(deadlines))


@types.coroutine
def _resume(call: Coroutine[Any, Any, None], awaited: Any) -> Generator[Any, None, None]:
    """Go on with ``call``, started by hand and suspended on ``awaited``, in the
    current task, exactly as an ``await`` of it would have: what it awaits goes
    to the task, and the task's wake-ups (and cancellations) come back to it.

    Why by hand: :meth:`H2Protocol._drain` starts each call with
    ``call.send(None)`` to learn whether it finishes at once (most do, and then
    cost no task). When it does not, the future it yielded has been taken out
    of it, and Python refuses a plain ``await call`` of a coroutine suspended
    in the middle ("coroutine is being awaited already"); this generator gives
    that future to the task first, then relays each wake-up, exception and
    cancellation, until the call returns. Pinned by
    tests/http2/test_hand_driven_calls.py.
    """
    while True:
        try:
            yield awaited
        except GeneratorExit:
            call.close()
            raise
        except BaseException as exc:  # the task throws in what the awaited raised
            try:
                awaited = call.throw(exc)
            except StopIteration:
                return
            continue
        try:
            awaited = call.send(None)
        except StopIteration:
            return


def _address(address: Any) -> tuple[str, int] | None:
    """ASGI's ``(host, port)`` of a socket address; None for a Unix socket."""
    if isinstance(address, tuple) and len(address) >= 2:
        return (str(address[0]), int(address[1]))
    return None


def _split_request(headers: Headers) -> tuple[str, bytes, str, bytes, Headers]:
    """(method, raw path, decoded path, query, regular headers) of a request's header
    list (the core has validated it: one :method and one non-empty :path)."""
    method = ""
    target = b"/"
    regular: Headers = []
    for name, value in headers:
        if name[:1] == b":":
            if name == b":method":
                method = value.decode("latin-1")
            elif name == b":path":
                target = value
        else:
            regular.append((name, value))
    raw_path, _, query = target.partition(b"?")
    text = raw_path.decode("latin-1")
    path = unquote(text, encoding="latin-1") if "%" in text else text
    return method, raw_path, path, query, regular
