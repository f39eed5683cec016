"""What a service registers, whichever server carries it: methods and health.

An app declares its methods as ``bytes -> bytes`` coroutines (the request's
serialized message in, the response's out; :class:`~meshplane.grpc_wire.RpcError`
for a non-OK status), and flips readiness on a :class:`HealthState`. Both
server backends (Envoy-based and h2) are adapters of these, so a decision
core never knows which one called it, and every transport passes the same
tests.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field

UnaryHandler = Callable[[bytes], Awaitable[bytes]]
#: A bidirectional stream: the requests' serialized messages in, as they arrive
#: (the iterator ends when the client half-closes), and a ``send`` for each
#: response message, at any time. Returning ends the call with OK; raising
#: :class:`~meshplane.grpc_wire.RpcError` ends it with that status.
StreamHandler = Callable[
    [AsyncIterator[bytes], Callable[[bytes], Awaitable[None]]], Awaitable[None]
]

#: The W3C ``(traceparent, tracestate)`` gRPC metadata of the call being
#: handled, for handlers whose request does not carry them (ShouldRateLimit:
#: Envoy's tracer puts them in the call's headers). Set by the servers only
#: when the call has a ``traceparent``, so an untraced call pays nothing.
_NO_TRACE_CONTEXT: tuple[str | None, str | None] = (None, None)
_TRACE_CONTEXT: ContextVar[tuple[str | None, str | None]] = ContextVar(
    "meshplane_trace_context", default=_NO_TRACE_CONTEXT
)
_MAX_TRACE_HEADER = 8192


def set_trace_context(traceparent: str | None, tracestate: str | None) -> None:
    """Record the current call's trace headers (servers call this; capped in size)."""
    if traceparent is not None and len(traceparent) + len(tracestate or "") <= _MAX_TRACE_HEADER:
        _TRACE_CONTEXT.set((traceparent, tracestate))


def note_trace_header(name: bytes, value: bytes) -> None:
    """One ``traceparent`` or ``tracestate`` header of the current call (HTTP/2 servers)."""
    traceparent, tracestate = _TRACE_CONTEXT.get()
    text = value.decode("latin-1")
    if name == b"traceparent":
        traceparent = text
    else:
        tracestate = text
    if len(text) <= _MAX_TRACE_HEADER:
        _TRACE_CONTEXT.set((traceparent, tracestate))


def incoming_trace_context() -> tuple[str | None, str | None]:
    """The current call's trace headers, consumed: a later call in the same
    context (a server that reuses one) never sees a previous call's."""
    value = _TRACE_CONTEXT.get()
    if value is not _NO_TRACE_CONTEXT:
        _TRACE_CONTEXT.set(_NO_TRACE_CONTEXT)
    return value


@dataclass
class Services:
    """The unary and streaming methods of one worker, by gRPC path
    (``/package.Service/Method``)."""

    methods: dict[str, UnaryHandler] = field(default_factory=dict)
    #: Bidirectional streaming methods, by gRPC path.
    streams: dict[str, StreamHandler] = field(default_factory=dict)

    def add_unary(self, service: str, method: str, handler: UnaryHandler) -> None:
        self.methods[self._free_path(service, method)] = handler

    def add_stream(self, service: str, method: str, handler: StreamHandler) -> None:
        """Serve a bidirectional streaming method (RLQS' StreamRateLimitQuotas)."""
        self.streams[self._free_path(service, method)] = handler

    def _free_path(self, service: str, method: str) -> str:
        """The method's gRPC path; ValueError when a unary or stream method has it."""
        path = f"/{service}/{method}"
        if path in self.methods or path in self.streams:
            raise ValueError(f"{path} is registered twice")
        return path

    def lookup(self, path: str) -> UnaryHandler | None:
        return self.methods.get(path)

    def by_service(self) -> dict[str, dict[str, UnaryHandler]]:
        grouped: dict[str, dict[str, UnaryHandler]] = {}
        for path, handler in self.methods.items():
            service, _, method = path[1:].partition("/")
            grouped.setdefault(service, {})[method] = handler
        return grouped


class Serving(enum.IntEnum):
    """``grpc.health.v1.HealthCheckResponse.ServingStatus``."""

    UNKNOWN = 0
    SERVING = 1
    NOT_SERVING = 2
    SERVICE_UNKNOWN = 3


class HealthState:
    """Readiness per service name (``""`` is the whole server), with watchers.

    The source of truth for every backend: the ASGI adapter (Envoy and h2
    backends) answers Check and Watch from it directly. Single-threaded (the
    worker's loop).
    """

    def __init__(self) -> None:
        self._status: dict[str, Serving] = {}
        self._changed = asyncio.Event()
        self._listeners: list[Callable[[str, Serving], None]] = []
        self.closed = False

    def add_listener(self, listener: Callable[[str, Serving], None]) -> None:
        self._listeners.append(listener)
        for name, status in self._status.items():
            listener(name, status)

    def set(self, name: str, status: Serving) -> None:
        if self._status.get(name) == status:
            return
        self._status[name] = status
        for listener in self._listeners:
            listener(name, status)
        self._wake()

    def get(self, name: str) -> Serving | None:
        return self._status.get(name)

    def close(self) -> None:
        """End every Watch (the worker is stopping)."""
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def watch(self, name: str) -> AsyncIterator[Serving]:
        """The status now, then every change, until :meth:`close` (as grpcio's Watch)."""
        last: Serving | None = None
        while not self.closed:
            status = self._status.get(name, Serving.SERVICE_UNKNOWN)
            if status != last:
                last = status
                yield status
            changed = self._changed
            if self.closed:
                return
            await changed.wait()
