"""The gRPC adapter of the Envoy-based server: an ASGI app that speaks gRPC.

Envoy terminates HTTP/2 (and TLS) and hands each stream to this app through
pyvoy's ASGI bridge: ``scope`` carries the method, path and headers, the
body arrives as ``http.request`` chunks, and the response goes back as
``http.response.start`` / ``body`` / ``trailers`` (pyvoy wants the last body
message, ``more_body: False``, before the trailers). grpcio's Python layer,
which cost ~240 µs a call, is not involved at all.

Served here:

- the app's unary methods (:class:`meshplane.rpc.Services`);
- ``grpc.health.v1.Health`` Check and Watch, from :class:`meshplane.rpc.HealthState`;
- the app's bidirectional streams (:data:`meshplane.rpc.StreamHandler`:
  requests as they arrive, responses sent at any time);
- ``grpc.reflection.v1alpha.ServerReflection`` (bidirectional: each request
  is answered as it arrives), so ``grpcurl list/describe`` work. grpcurl
  tries ``v1`` first and falls back on its UNIMPLEMENTED, as with grpcio.

The wire rules (framing, compression, size limit, timeout) are those of
:mod:`meshplane.grpc_wire`; what happens on each failure:

=============================  =========================================
non-POST, or not application/grpc  HTTP 415 (no gRPC status), as grpc-go
unknown path                   UNIMPLEMENTED
compressed, encoding not gzip  UNIMPLEMENTED
message over the limit         RESOURCE_EXHAUSTED
body ends mid-message          INTERNAL
no message / two messages      INTERNAL / UNIMPLEMENTED (unary)
``grpc-timeout`` passes        DEADLINE_EXCEEDED, the handler is cancelled
client resets the stream       the answer is dropped (see below)
handler raises RpcError        its code and message
handler raises anything else   UNKNOWN (logged with its type)
=============================  =========================================

A client that cancels: pyvoy 1.3 tells the app about a reset stream only
when the app sends on it (``receive()`` keeps returning an empty
``http.request``), so the handler is not interrupted as grpcio's is; it
runs to its end, bounded by the ``grpc-timeout`` (and each service's own
bounds: a Check is pure CPU, a rate-limit decision waits for Redis at most
its store timeout), and its answer is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection, reflection_pb2

from meshplane.grpc_wire import (
    DEFAULT_MAX_MESSAGE_BYTES,
    Code,
    MessageReader,
    RpcError,
    frame,
    is_grpc_content_type,
    parse_timeout,
    status_headers,
)
from meshplane.rpc import (
    HealthState,
    Services,
    StreamHandler,
    UnaryHandler,
    incoming_trace_context,
    note_trace_header,
)
from meshplane.server_contract import UnaryResponder

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

HEALTH_SERVICE: str = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
REFLECTION_SERVICE: str = reflection.SERVICE_NAME

_CONTENT_TYPE = (b"content-type", b"application/grpc")
_START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [_CONTENT_TYPE],
    "trailers": True,
}
_OK_TRAILERS = {
    "type": "http.response.trailers",
    "headers": status_headers(Code.OK),
    "more_trailers": False,
}
_UNSUPPORTED_MEDIA = {
    "type": "http.response.start",
    "status": 415,
    "headers": [(b"content-type", b"text/plain")],
}
_EMPTY_BODY = {"type": "http.response.body", "body": b"", "more_body": False}


class HeldBytes:
    """The worker's budget for request bytes its calls hold before their message is
    whole (a backend whose HTTP/2 layer does not count them: the Envoy backend,
    where pyvoy hands each chunk over as it arrives and Envoy's overload manager
    sees no buffer of its own to reset).

    A call that would take the total past ``limit`` is answered
    RESOURCE_EXHAUSTED and its bytes are released: the peer that sends the
    bytes crossing the budget loses its call, and while the budget is spent
    every call that needs to hold a body is refused (a call whose message came
    whole in its first chunk holds nothing here and is served).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0  # the most held since the allocator last gave memory back

    def take(self, size: int) -> None:
        held = self.held + size
        if held > self.limit:
            raise RpcError(Code.RESOURCE_EXHAUSTED, "the worker's request buffer budget is spent")
        self.held = held
        self.peak = max(self.peak, held)

    def give_back(self) -> bool:
        """Once most of a large peak is released: True, and the peak restarts (the
        caller returns free heap pages to the system)."""
        if self.peak >= self.limit // 4 and self.held < self.peak // 4:
            self.peak = self.held
            return True
        return False


class CallsInFlight:
    """Counts the calls being answered, so that a drain can wait for none.

    The adapter changes ``count`` itself (no method call on the hot path)
    and calls :meth:`idle` when it drops to zero.
    """

    def __init__(self) -> None:
        self.count = 0
        self._idle: asyncio.Event | None = None

    def idle(self) -> None:
        if self._idle is not None:
            self._idle.set()

    async def wait_idle(self) -> None:
        while self.count:
            self._idle = asyncio.Event()
            await self._idle.wait()

    async def drain(self, grace: float) -> None:
        """A worker's drain: wait for no call in flight, at most ``grace`` seconds
        (the calls still running then are logged and left to the caller's close)."""
        try:
            async with asyncio.timeout(grace):
                await self.wait_idle()
        except TimeoutError:
            log.warning("calls still in flight after the grace period", extra={"calls": self.count})


#: One call's ``grpc-timeout`` on the heap, a list made on every call (a
#: class's instance cost ~0.3 µs more to make): when it passes, a sequence
#: number (no two entries compare further), the task to cancel (None once the
#: call is over), whether the deadline cancelled it, and the task's
#: cancellation count at the start (``asyncio.timeout``'s rule for telling
#: its cancellation from others).
_Deadline = list[Any]
_WHEN, _SEQ, _TASK, _EXPIRED, _CANCELLING = range(5)


class Deadlines:
    """The ``grpc-timeout`` of every call in flight, on one timer.

    ``asyncio.timeout`` around each call cost ~5 µs of CPU on uvloop (a
    ``Timeout``, a timer created and cancelled, task bookkeeping), a timer
    alone ~2.4 µs: a tenth of a whole Check. Here a call pushes its deadline
    on a heap (:meth:`start`) and reports its end (:meth:`end`); one timer,
    armed at the earliest pending deadline, cancels the tasks whose deadline
    has passed, exactly as ``asyncio.timeout`` would, and :meth:`end` tells
    that cancellation (DEADLINE_EXCEEDED) from any other (which the caller
    lets through). Calls that are over leave the heap when they reach its top,
    or, since a client may send a far deadline that keeps later ones from
    the top, when the heap has doubled since it was last compacted.
    """

    _MIN_COMPACT = 1024

    def __init__(self) -> None:
        self._heap: list[_Deadline] = []
        self._seq = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._compact_at = self._MIN_COMPACT
        self._loop: asyncio.AbstractEventLoop | None = None

    def __len__(self) -> int:
        return len(self._heap)

    def start(self, timeout: float) -> _Deadline:
        """Cancel the current task once ``timeout`` seconds have passed, unless
        :meth:`end` comes first."""
        loop = self._loop
        if loop is None or not loop.is_running():
            # Kept: asyncio.get_running_loop() (and current_task() without a
            # loop) cost a getpid system call each on Python 3.11.
            loop = self._loop = asyncio.get_running_loop()
        when = loop.time() + timeout
        task = asyncio.current_task(loop)
        entry = [when, next(self._seq), task, False, 0 if task is None else task.cancelling()]
        heap = self._heap
        while heap and heap[0][_TASK] is None:  # calls over: dropped on the way
            heapq.heappop(heap)
        heapq.heappush(heap, entry)
        if len(heap) > self._compact_at:
            heap[:] = [item for item in heap if item[_TASK] is not None]
            heapq.heapify(heap)
            self._compact_at = max(self._MIN_COMPACT, 2 * len(heap))
        if when < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = loop.call_at(when, self._expire)
            self._timer_at = when
        return entry

    @staticmethod
    def end(entry: _Deadline) -> bool:
        """The call is over (call once, on every path). True when its deadline
        cancelled it and nothing else did: the caller answers DEADLINE_EXCEEDED
        for a CancelledError then, and re-raises it otherwise."""
        task, entry[_TASK] = entry[_TASK], None
        return bool(entry[_EXPIRED]) and task is not None and task.uncancel() <= entry[_CANCELLING]

    def _expire(self) -> None:
        self._timer, self._timer_at = None, math.inf
        heap = self._heap
        loop = asyncio.get_running_loop()
        now = loop.time()
        while heap and (heap[0][_TASK] is None or heap[0][_WHEN] <= now):
            entry = heapq.heappop(heap)
            task = entry[_TASK]
            if task is not None and not task.done():
                entry[_EXPIRED] = True
                task.cancel()
        if heap:
            self._timer_at = heap[0][_WHEN]
            self._timer = loop.call_at(self._timer_at, self._expire)


#: Parsed ``grpc-timeout`` values: a proxy sends the same few (its filters'
#: timeouts), so each is parsed once; bounded, since clients choose them.
_TIMEOUTS: dict[bytes, float | None] = {}
_MAX_TIMEOUTS = 256


def _timeout_of(header: bytes) -> float | None:
    """``grpc-timeout`` in seconds (None if malformed), parsed once per value."""
    try:
        return _TIMEOUTS[header]
    except KeyError:
        pass
    if len(_TIMEOUTS) >= _MAX_TIMEOUTS:
        _TIMEOUTS.clear()
    seconds = _TIMEOUTS[header] = parse_timeout(header.decode("latin-1"))
    return seconds


#: What :func:`grpc_head` reads of a gRPC request's headers: ``grpc-encoding``
#: (raw), the ``grpc-timeout`` in seconds (None: none, or malformed) and whether
#: trace headers came (a plain tuple: a class's instance costs more to make).
GrpcHead = tuple[bytes | None, float | None, bool]


def grpc_head(method: str, headers: Sequence[tuple[bytes, bytes]]) -> GrpcHead | None:
    """The request headers of a gRPC call, read once for both entries of
    :class:`GrpcAsgiApp`; None when it is not a gRPC request (not POST, or no
    gRPC content type: HTTP 415).

    Equal to the plain reading (:func:`meshplane.grpc_wire.is_grpc_content_type`
    on the decoded last ``content-type``, :func:`~meshplane.grpc_wire.parse_timeout`
    on the last ``grpc-timeout``), pinned by tests/runtime/test_unary_parse.py;
    faster by comparing bytes with the exact ``application/grpc`` before
    decoding anything, and by parsing each distinct timeout once (:func:`_timeout_of`).
    """
    content_type = encoding = timeout_header = None
    traced = False
    for name, value in headers:
        if name == b"content-type":
            content_type = value
        elif name == b"grpc-encoding":
            encoding = value
        elif name == b"grpc-timeout":
            timeout_header = value
        elif name == b"traceparent" or name == b"tracestate":  # noqa: PLR1714 - hot path
            traced = True  # only a traced call pays for noting them
    if method != "POST" or (
        content_type != b"application/grpc"
        and (content_type is None or not is_grpc_content_type(content_type.decode("latin-1")))
    ):
        return None
    return encoding, None if timeout_header is None else _timeout_of(timeout_header), traced


def whole_message(body: bytes, limit: int) -> bytes | None:
    """The message of a request body that is exactly one uncompressed gRPC message
    of at most ``limit`` bytes (the usual unary call); None for anything else,
    which :class:`~meshplane.grpc_wire.MessageReader` then reads and answers
    (compressed, truncated, two messages, none, over the limit, bad flag).

    Equal to what that reader makes of such a body, without its buffer
    (pinned by tests/runtime/test_unary_parse.py).
    """
    if (
        len(body) > 4
        and body[0] == 0
        and int.from_bytes(body[1:5], "big") == len(body) - 5
        and len(body) - 5 <= limit
    ):
        return body[5:]
    return None


class GrpcAsgiApp:
    """Routes gRPC calls to unary handlers, health and reflection (see module doc)."""

    def __init__(
        self,
        services: Services,
        health: HealthState,
        service_names: Sequence[str],
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_held_request_bytes: int | None = None,
    ) -> None:
        self._unary: dict[str, UnaryHandler] = dict(services.methods)
        self._unary[f"/{HEALTH_SERVICE}/Check"] = self._health_check
        self._streams: dict[str, Callable[[bytes, MessageReader, Receive, Send], Awaitable[None]]]
        self._streams = {
            f"/{HEALTH_SERVICE}/Watch": self._health_watch,
            f"/{REFLECTION_SERVICE}/ServerReflectionInfo": self._reflection_info,
        }
        self._bidi: dict[str, StreamHandler] = dict(services.streams)
        self._health = health
        names = (*service_names, HEALTH_SERVICE, REFLECTION_SERVICE)
        self._reflection = reflection.ReflectionServicer(names, pool=reflection_pool(names))
        self._max = max_message_bytes
        self.held = None if max_held_request_bytes is None else HeldBytes(max_held_request_bytes)
        self.in_flight = CallsInFlight()
        self.deadlines = Deadlines()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The hot path is written flat on purpose: every call pays each extra
        # frame, object and lookup here (measured: ~11 µs of adapter per
        # call before this shape, a fifth of a Check). The request is read by
        # the same two functions as complete_unary's (grpc_head, whole_message).
        headers = scope["headers"]
        head = grpc_head(scope["method"], headers)
        if head is None:
            await send(_UNSUPPORTED_MEDIA)
            await send(_EMPTY_BODY)
            return
        encoding, deadline, traced = head
        if traced:
            _note_trace_headers(headers)
        handler = self._unary.get(path := scope["path"])
        in_flight = self.in_flight
        in_flight.count += 1
        try:
            if handler is None:
                stream = self._streams.get(path)
                bidi = self._bidi.get(path) if stream is None else None
                if bidi is not None:
                    await _bidi_call(bidi, self._reader(encoding), receive, send)
                elif stream is None:
                    await _trailers_only(send, Code.UNIMPLEMENTED, f"Method not found: {path}")
                else:
                    await self._stream_call(stream, self._reader(encoding), receive, send)
                return
            message = await receive()
            body = message.get("body", b"")
            request = None if message.get("more_body") else whole_message(body, self._max)
            if request is not None:
                # The usual call: one uncompressed message in one chunk. Envoy's
                # ext_authz and ratelimit filters always send grpc-timeout.
                result = await self._run(handler, request, deadline)
                if isinstance(result, Exception):
                    await _failed(send, result)
                else:
                    await _answer(send, result)
                return
            await self._unary_call(
                handler, message, receive, send, encoding=encoding, deadline=deadline
            )
        finally:
            if traced:
                incoming_trace_context()  # not left to a later call in this context
            in_flight.count -= 1
            if not in_flight.count:
                in_flight.idle()

    def complete_unary(
        self,
        method: str,
        path: str,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        responder: UnaryResponder,
    ) -> Awaitable[None] | None:
        """The usual call without ASGI messages, for a backend that has the whole
        request body (the h2 backend): a :data:`CompleteUnaryEntry`.

        None, having done nothing, unless the request is what :meth:`__call__`'s
        fast path serves (a unary method, :func:`grpc_head` and
        :func:`whole_message` both say yes: the very functions that path reads
        the request with); the backend then calls :meth:`__call__`, which
        answers the rest. The call itself is the same as there (:meth:`_run`:
        deadline, statuses, in-flight count), and the answer the same header
        lists, handed over in one ``respond`` instead of three ``send`` awaits
        (~2 µs a call on the h2 backend).
        """
        handler = self._unary.get(path)
        if handler is None:
            return None
        request = whole_message(body, self._max)
        if request is None:
            return None
        head = grpc_head(method, headers)
        if head is None:
            return None
        _, deadline, traced = head
        if traced:
            _note_trace_headers(headers)
        return self._complete_call(handler, request, deadline, responder, traced)

    async def _complete_call(
        self,
        handler: UnaryHandler,
        request: bytes,
        deadline: float | None,
        responder: UnaryResponder,
        traced: bool,
    ) -> None:
        in_flight = self.in_flight
        in_flight.count += 1
        try:
            result = await self._run(handler, request, deadline)
            if isinstance(result, Exception):
                responder.respond(_failure_start(result), b"", None)
            else:
                responder.respond(_START, frame(result), _OK_TRAILERS)
        finally:
            if traced:
                incoming_trace_context()  # not left to a later call in this context
            in_flight.count -= 1
            if not in_flight.count:
                in_flight.idle()

    async def _run(
        self, handler: UnaryHandler, request: bytes, deadline: float | None
    ) -> bytes | Exception:
        """The handler's response, or what it raised (TimeoutError when the
        ``grpc-timeout`` cancelled it); another cancellation goes through."""
        if deadline is None:
            try:
                return await handler(request)
            except Exception as exc:
                return exc
        entry = self.deadlines.start(deadline)  # cancels the handler when it passes
        try:
            response = await handler(request)
        except asyncio.CancelledError:
            if not Deadlines.end(entry):
                raise
            return TimeoutError()
        except Exception as exc:
            Deadlines.end(entry)
            return exc
        Deadlines.end(entry)
        return response

    def _reader(self, encoding: bytes | None) -> MessageReader:
        return MessageReader(encoding.decode("latin-1") if encoding else None, self._max)

    async def _unary_call(
        self,
        handler: UnaryHandler,
        first: Message,
        receive: Receive,
        send: Send,
        *,
        encoding: bytes | None,
        deadline: float | None,
    ) -> None:
        """Everything but the usual call: split, compressed or oversized."""
        reader = self._reader(encoding)
        try:
            async with asyncio.timeout(deadline):  # cancels the handler when it passes
                request = await _read_one(reader, first, receive, self.held)
                response = await handler(request)
        except Exception as exc:
            await _failed(send, exc)
            return
        await _answer(send, response)

    async def _stream_call(
        self,
        handler: Callable[[bytes, MessageReader, Receive, Send], Awaitable[None]],
        reader: MessageReader,
        receive: Receive,
        send: Send,
    ) -> None:
        try:
            first = await _read_first(reader, receive)
            await handler(first, reader, receive, send)
        except RpcError as exc:
            await _trailers_only(send, exc.code, exc.message)
        except Exception as exc:
            log.debug("gRPC stream ended", extra={"error": type(exc).__name__})

    # grpc.health.v1 -----------------------------------------------------------------

    async def _health_check(self, request: bytes) -> bytes:
        name = health_pb2.HealthCheckRequest.FromString(request).service
        status = self._health.get(name)
        if status is None:
            raise RpcError(Code.NOT_FOUND, "Unknown service")
        return bytes(health_pb2.HealthCheckResponse(status=int(status)).SerializeToString())

    async def _health_watch(
        self, first: bytes, reader: MessageReader, receive: Receive, send: Send
    ) -> None:
        """The status now and at every change, until the worker stops.

        pyvoy reports a client that went away only when something is sent
        to it, so a watcher that left is noticed at the next change (or at
        the drain, which ends every Watch).
        """
        name = health_pb2.HealthCheckRequest.FromString(first).service
        await send(_START)
        async for status in self._health.watch(name):
            reply = health_pb2.HealthCheckResponse(status=int(status)).SerializeToString()
            await send({"type": "http.response.body", "body": frame(reply), "more_body": True})
        await send(_EMPTY_BODY)
        await send(_trailers(Code.UNAVAILABLE, "server is shutting down"))

    # grpc.reflection.v1alpha ----------------------------------------------------------

    async def _reflection_info(
        self, first: bytes, reader: MessageReader, receive: Receive, send: Send
    ) -> None:
        """Answer each request as it arrives (grpcurl waits for one answer
        before it sends its next request on the same stream).

        A peer may pipeline thousands of small requests, each asking for an
        answer a hundred times bigger: each answer is one ``send``, which waits
        while the peer does not take them (the backend's high-water marks) and
        raises once the stream is reset, and the loop yields between answers,
        so other calls run meanwhile and a peer that left costs nothing more.
        """
        await send(_START)
        pending = [first]
        while True:
            for raw in pending:
                request = reflection_pb2.ServerReflectionRequest.FromString(raw)
                (reply,) = self._reflection.ServerReflectionInfo(iter([request]), None)
                body = frame(reply.SerializeToString())
                await send({"type": "http.response.body", "body": body, "more_body": True})
                await asyncio.sleep(0)
            if reader.closed:
                await send(_EMPTY_BODY)
                await send(_OK_TRAILERS)
                return
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            pending = reader.feed(message.get("body", b""))
            reader.closed = not message.get("more_body")


async def _bidi_call(
    handler: StreamHandler, reader: MessageReader, receive: Receive, send: Send
) -> None:
    """An app's bidirectional stream over ASGI messages.

    The requests are read as they arrive (several in one chunk are all
    delivered); the iterator ends when the client half-closes or goes away.
    Responses go out as they are sent, after one response start. The handler's
    return is OK, its RpcError that status; a client that went away ends the
    call without a status (nobody to tell).
    """
    started = False

    async def requests() -> AsyncIterator[bytes]:
        while not reader.closed:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            reader.closed = not message.get("more_body")
            for raw in reader.feed(message.get("body", b"")):
                yield raw

    async def respond(message: bytes) -> None:
        nonlocal started
        if not started:
            started = True
            await send(_START)
        await send({"type": "http.response.body", "body": frame(message), "more_body": True})

    try:
        await handler(requests(), respond)
    except RpcError as exc:
        if not started:
            await _trailers_only(send, exc.code, exc.message)
            return
        with contextlib.suppress(Exception):
            await send(_EMPTY_BODY)
            await send(_trailers(exc.code, exc.message))
        return
    except Exception as exc:  # the client is gone, or the handler failed
        log.debug("gRPC stream ended", extra={"error": type(exc).__name__})
        return
    with contextlib.suppress(Exception):
        if not started:
            await send(_START)
        await send(_EMPTY_BODY)
        await send(_OK_TRAILERS)


def reflection_pool(service_names: Sequence[str]) -> descriptor_pool.DescriptorPool:
    """The files reflection serves: those defining ``service_names`` and what they
    import, nothing else of the process's descriptor pool (which holds every
    proto any imported module loaded: descriptor.proto alone is a 14 KB answer
    to a 34-byte request). Names without a descriptor (raw-bytes services) are
    skipped."""
    default = descriptor_pool.Default()
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(file: Any) -> None:
        if file.name in added:
            return
        added.add(file.name)
        for dependency in file.dependencies:
            add(dependency)
        pool.AddSerializedFile(file.serialized_pb)

    for name in service_names:
        try:
            add(default.FindServiceByName(name).file)
        except KeyError:
            continue
    return pool


def _trailers(code: Code, message: str) -> Message:
    return {"type": "http.response.trailers", "headers": status_headers(code, message)}


def _note_trace_headers(headers: Sequence[tuple[bytes, bytes]]) -> None:
    """Hand the call's trace headers to its handler (:func:`note_trace_header`).

    Consumed (:func:`incoming_trace_context`) when the call ends, so a backend
    that runs several calls in one task's context (the h2 backend's drain)
    never gives one call's headers to the next.
    """
    for name, value in headers:
        if name == b"traceparent" or name == b"tracestate":  # noqa: PLR1714 - hot path
            note_trace_header(name, value)


def _trailers_only_start(code: Code, message: str) -> Message:
    """The one start message of gRPC's Trailers-Only response (a status, no message)."""
    headers = [_CONTENT_TYPE, *status_headers(code, message)]
    return {"type": "http.response.start", "status": 200, "headers": headers}


async def _trailers_only(send: Send, code: Code, message: str) -> None:
    """A status without a message: gRPC's Trailers-Only response (one HEADERS frame)."""
    with contextlib.suppress(Exception):  # the client may be gone
        await send(_trailers_only_start(code, message))
        await send(_EMPTY_BODY)


async def _answer(send: Send, response: bytes) -> None:
    """One message and ``grpc-status: 0`` (try/except: cheaper than a context manager)."""
    try:
        await send(_START)
        await send({"type": "http.response.body", "body": frame(response)})
        await send(_OK_TRAILERS)
    except Exception:  # noqa: S110 - the client is gone: nobody to tell
        pass


def _failure_start(exc: Exception) -> Message:
    """The Trailers-Only answer of a call that failed: the RpcError's own status,
    DEADLINE_EXCEEDED for the deadline (``asyncio.timeout`` raises TimeoutError),
    else UNKNOWN (logged: a handler's bug)."""
    if isinstance(exc, RpcError):
        return _trailers_only_start(exc.code, exc.message)
    if isinstance(exc, TimeoutError):
        return _trailers_only_start(Code.DEADLINE_EXCEEDED, "Deadline Exceeded")
    log.error("gRPC handler failed", exc_info=exc, extra={"error": type(exc).__name__})
    return _trailers_only_start(Code.UNKNOWN, f"Unexpected {type(exc).__name__}")


async def _failed(send: Send, exc: Exception) -> None:
    """The status of a call that failed (:func:`_failure_start`), Trailers-Only."""
    start = _failure_start(exc)
    with contextlib.suppress(Exception):  # the client may be gone
        await send(start)
        await send(_EMPTY_BODY)


async def _read_one(
    reader: MessageReader, message: Message, receive: Receive, held: HeldBytes | None
) -> bytes:
    """The one message of a unary request, from ``message`` (the first chunk) on;
    the bytes held meanwhile are charged to ``held``, if given."""
    messages: list[bytes] = []
    taken = 0
    try:
        while True:
            if message["type"] != "http.request":
                raise RpcError(Code.CANCELLED, "the client went away")
            body = message.get("body", b"")
            if held is not None and message.get("more_body"):
                held.take(len(body))
                taken += len(body)
            messages += reader.feed(body)
            if not message.get("more_body"):
                break
            message = await receive()
    finally:
        if held is not None:
            held.held -= taken
    if reader.pending:
        raise RpcError(Code.INTERNAL, "the request ended in the middle of a message")
    if not messages:
        raise RpcError(Code.INTERNAL, "no request message")
    if len(messages) > 1:
        raise RpcError(Code.UNIMPLEMENTED, "more than one request message for a unary method")
    return messages[0]


async def _read_first(reader: MessageReader, receive: Receive) -> bytes:
    """The first message of a streaming request (the rest is left to the handler)."""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise RpcError(Code.CANCELLED, "the client went away")
        messages = reader.feed(message.get("body", b""))
        reader.closed = not message.get("more_body")
        if messages:
            if len(messages) > 1:
                raise RpcError(Code.UNIMPLEMENTED, "pipelined stream requests")
            return messages[0]
        if not message.get("more_body"):
            raise RpcError(Code.INTERNAL, "no request message")
