"""The contracts of the server runtime: app ↔ runtime, and backend ↔ supervisor.

Every meshplane gRPC service is an app (:class:`GrpcApp`) that a backend runs
in N worker processes, which a supervisor (:mod:`meshplane.server`) keeps up.
Two backends carry the same apps: ``envoy`` (Envoy + pyvoy,
:mod:`meshplane.servers.envoy.server` and :mod:`meshplane.servers.envoy.worker`) and ``h2``
(meshplane's own HTTP/2 server, :mod:`meshplane.servers.h2.server`); docs/runtime.md
says what each gives that the other cannot. This module is what they agree on, so
neither side imports the other:

- **app ↔ runtime**: an app registers ``bytes -> bytes`` unary handlers and
  flips readiness on a :class:`WorkerContext`, whichever backend runs it;
  :class:`ServeOptions` says how it is exposed;
- **backend ↔ supervisor**: a backend is a :data:`Backend`, a context manager
  that yields a :data:`StartWorker`; the supervisor sees each worker as a
  :class:`WorkerProcess` (alive, exit code, drain, kill).

Nothing here imports a server library: apps and backends import it, it
imports only the neutral handler registry (:mod:`meshplane.rpc`) and the TLS
file names (:mod:`meshplane.tls`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args

from meshplane.rpc import HealthState, Services, Serving, StreamHandler, UnaryHandler
from meshplane.tls import ListenerTlsFiles

ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]


class UnaryResponder(Protocol):
    """Where a complete unary call's answer goes (an HTTP/2 backend's stream).

    The header lists and the body are the app's (it owns gRPC's semantics);
    the backend only puts them on the wire, in one go, with no ASGI messages.
    """

    def respond(self, start: dict[str, Any], body: bytes, trailers: dict[str, Any] | None) -> None:
        """``start`` (an ``http.response.start`` message), then ``body`` and
        ``trailers`` (an ``http.response.trailers`` message); ``trailers`` None
        is a Trailers-Only answer: ``start`` alone ends the stream."""


#: The fast entry of a gRPC ASGI app for a request whose body has all arrived:
#: ``(method, path, headers, body, responder)`` → the call to await, or None
#: (having done nothing) when the request is not a plain unary call; the backend
#: then runs it through the ASGI app.
CompleteUnaryEntry = Callable[
    [str, str, Sequence[tuple[bytes, bytes]], bytes, UnaryResponder], Awaitable[None] | None
]
ServerKind = Literal["envoy", "h2"]
#: The backends, the default first (``--server`` choices).
SERVER_KINDS: tuple[ServerKind, ...] = get_args(ServerKind)


@dataclass(frozen=True)
class ServeOptions:
    """How a service is exposed. Defaults suit a sidecar-less Kubernetes pod."""

    listen: str = "127.0.0.1:8081"
    workers: int = 1
    metrics_listen: str | None = None
    http_listen: str | None = None
    grace_seconds: float = 5.0
    server: ServerKind = "envoy"
    tls: ListenerTlsFiles | None = None
    #: Envoy worker threads per worker process (``--concurrency``); the app's
    #: Python runs on one thread per process whatever this is.
    envoy_threads: int = 1


@dataclass
class WorkerContext:
    """What an app gets to wire itself into a worker, whichever server runs it."""

    services: Services
    health: HealthState
    service_names: Sequence[str]

    def add_unary(self, service: str, method: str, handler: UnaryHandler) -> None:
        """Serve ``/service/method``: serialized request in, serialized response out."""
        self.services.add_unary(service, method, handler)

    def add_stream(self, service: str, method: str, handler: StreamHandler) -> None:
        """Serve a bidirectional stream ``/service/method`` (every backend)."""
        self.services.add_stream(service, method, handler)

    def set_serving(self, serving: bool) -> None:
        """Flip readiness of every service of this worker (and the overall "")."""
        status = Serving.SERVING if serving else Serving.NOT_SERVING
        for name in (*self.service_names, ""):
            self.health.set(name, status)


class GrpcApp(Protocol):
    """One worker's application."""

    service_names: Sequence[str]
    http_app: ASGIApp | None

    async def start(self, ctx: WorkerContext) -> None:
        """Register handlers with ``ctx.add_unary`` and start background tasks."""

    async def stop(self) -> None:
        """Release resources; called after the server has drained."""


def new_worker_context(app: GrpcApp) -> WorkerContext:
    """A context reporting SERVING (the app may flip it back during start())."""
    ctx = WorkerContext(Services(), HealthState(), tuple(app.service_names))
    ctx.set_serving(True)
    return ctx


class WorkerProcess(Protocol):
    """A worker as the supervisor sees it, whichever server it runs."""

    @property
    def pid(self) -> int | None: ...

    @property
    def exitcode(self) -> int | None: ...

    def is_alive(self) -> bool: ...

    def request_drain(self) -> None:
        """Ask the worker to drain and exit (what SIGTERM to the supervisor means)."""

    def join(self, timeout: float) -> None: ...

    def kill(self) -> None: ...


#: Starts worker ``i`` (at first, and again when it died after its startup).
StartWorker = Callable[[int], WorkerProcess]

#: A backend: ``(app factory, options, service name)`` → a context manager
#: whose value starts workers; what the workers share (a run directory)
#: lives as long as the context.
Backend = Callable[[Callable[[], GrpcApp], ServeOptions, str], AbstractContextManager[StartWorker]]
