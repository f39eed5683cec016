"""The h2 backend: each worker is a spawned Python process serving HTTP/2 itself on uvloop.

No Envoy and no grpcio between the socket and the app: a worker's event loop
reads the socket, runs meshplane's own HTTP/2 core (:mod:`meshplane.servers.h2.http2`,
pure, with every hostile-peer limit) through :mod:`meshplane.servers.h2.protocol`,
and hands each stream to the same ASGI gRPC adapter the Envoy backend runs
(:class:`meshplane.asgi_grpc.GrpcAsgiApp`: framing, deadlines, health Check
and Watch, reflection, tracing metadata). A call costs one ``epoll_wait``
wake-up, one read and one write, no thread hand-off: the cheapest backend
per call (docs/benchmarks.md). What Envoy has and this has not: Envoy's
fuzzed, hardened C++ codec; here the limits are the core's and
:class:`~meshplane.servers.h2.protocol.H2Settings`. A worker's memory is bounded by
its buffer budget (``max_buffered_bytes``: request bytes held plus answer
bytes queued, over all its connections; past it new streams are refused and
the biggest holder is cut off), not by the connection cap: a connection may
hold 16 MiB of bodies and 16 MiB of answers, so 10,000 of them would be
320 GiB. Once most of a large peak is released, the worker hands the freed
heap back to the system (glibc's ``malloc_trim``).

A worker is a spawned process (:func:`meshplane.worker_support.spawned_starter`):
SO_REUSEPORT on a TCP port, or one worker on a ``unix:`` path; the app's
``http_app`` under uvicorn; the startup heap frozen; JSON logs; SIGTERM (the
supervisor's drain) or the supervisor's death start a drain:

1. every service NOT_SERVING (Watch streams see it);
2. the listening socket closes (a new connection is refused at once and
   goes to another replica), and every connection gets GOAWAY(NO_ERROR):
   its open calls finish, new streams are refused; Watch streams end;
3. the worker waits for the calls in flight (``GrpcAsgiApp.in_flight``)
   within ``grace_seconds``, then closes what is left and stops the app.

TLS (``ServeOptions.tls``): a :class:`meshplane.tls.ReloadingServerContext`
offering ``h2`` in ALPN (rotated files are picked up), client certificates
required with a client CA (refused at the handshake).

Tunables, for operators (environment, read by each worker; defaults in
:class:`~meshplane.servers.h2.protocol.H2Settings`): ``MESHPLANE_H2_HANDSHAKE_SECONDS``,
``MESHPLANE_H2_IDLE_SECONDS``, ``MESHPLANE_H2_FRAME_SECONDS``,
``MESHPLANE_H2_SEND_STALL_SECONDS``, ``MESHPLANE_H2_MAX_CONNECTIONS``,
``MESHPLANE_H2_MAX_AGE_SECONDS``, ``MESHPLANE_H2_MAX_BUFFERED_BYTES``.

Metrics (created at zero, summed over workers): connections opened, refused
(over the cap) and open; streams; stream resets and connection ends by
HTTP/2 error code. Counted in plain integers on the hot path and written to
prometheus_client once a second (:data:`METRICS_FLUSH_SECONDS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, replace

from prometheus_client import Counter, Gauge

from meshplane.asgi_grpc import GrpcAsgiApp
from meshplane.netaddr import unix_listen_path
from meshplane.rpc import Serving
from meshplane.server_contract import GrpcApp, ServeOptions, StartWorker, new_worker_context
from meshplane.servers.h2.protocol import ERROR_NAMES, ConnectionSet, H2Settings, H2Stats
from meshplane.tls import ListenerTlsFiles, ReloadingServerContext
from meshplane.worker_support import (
    HttpSide,
    reuseport_socket,
    serve_until_stopped,
    spawned_starter,
    trim_heap,
)

log = logging.getLogger(__name__)

#: How often the connections' counts become metrics.
METRICS_FLUSH_SECONDS = 1.0
#: How long the last bytes (GOAWAY) of the connections a drain closes may take.
CLOSE_SECONDS = 1.0
#: The listening socket's accept queue (the kernel's ``somaxconn`` caps it).
LISTEN_BACKLOG = 1024

#: Environment variable -> H2Settings field.
ENV_SETTINGS: Mapping[str, str] = {
    "MESHPLANE_H2_HANDSHAKE_SECONDS": "handshake_seconds",
    "MESHPLANE_H2_IDLE_SECONDS": "idle_seconds",
    "MESHPLANE_H2_FRAME_SECONDS": "frame_seconds",
    "MESHPLANE_H2_SEND_STALL_SECONDS": "send_stall_seconds",
    "MESHPLANE_H2_MAX_CONNECTIONS": "max_connections",
    "MESHPLANE_H2_MAX_AGE_SECONDS": "max_age_seconds",
    "MESHPLANE_H2_MAX_BUFFERED_BYTES": "max_buffered_bytes",
}
#: The settings that are counts (the others are seconds).
_INT_SETTINGS = frozenset({"max_connections", "max_buffered_bytes"})

CONNECTIONS_OPENED = Counter(
    "meshplane_h2_connections_opened_total", "HTTP/2 connections accepted (--server h2)."
)
CONNECTIONS_REFUSED = Counter(
    "meshplane_h2_connections_refused_total",
    "HTTP/2 connections closed at once: the worker's connection cap was reached.",
)
CONNECTIONS_OPEN = Gauge(
    "meshplane_h2_connections_open",
    "HTTP/2 connections open now (--server h2).",
    multiprocess_mode="livesum",
)
STREAMS = Counter("meshplane_h2_streams_total", "HTTP/2 request streams (calls) started.")
STREAM_RESETS = Counter(
    "meshplane_h2_stream_resets_total",
    "HTTP/2 streams reset by either side (RST_STREAM), by error code.",
    ["code"],
)
CONNECTION_ENDS = Counter(
    "meshplane_h2_connection_ends_total",
    "HTTP/2 connections ended by a GOAWAY (sent or received) or a timeout, by error code.",
    ["code"],
)


def settings_from_env(environ: Mapping[str, str] | None = None) -> H2Settings:
    """The defaults, with the ``MESHPLANE_H2_*`` overrides; ValueError names a bad one."""
    environ = os.environ if environ is None else environ
    changes: dict[str, float | int] = {}
    for name, attr in ENV_SETTINGS.items():
        text = environ.get(name)
        if text is None or not text.strip():
            continue
        try:
            changes[attr] = int(text) if attr in _INT_SETTINGS else float(text)
        except ValueError:
            raise ValueError(f"{name}={text!r} is not a number") from None
    try:
        return replace(H2Settings(), **changes)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ValueError(f"MESHPLANE_H2_*: {exc}") from None


def _register_zeros() -> None:
    """Every series at 0 before anything happens (a rate over a new series needs it)."""
    CONNECTIONS_OPEN.set(0)
    for name in ERROR_NAMES.values():
        STREAM_RESETS.labels(name)
        CONNECTION_ENDS.labels(name)


def _publish(stats: H2Stats, open_connections: int) -> None:
    taken = stats.take()
    if taken.connections_opened:
        CONNECTIONS_OPENED.inc(taken.connections_opened)
    if taken.connections_refused:
        CONNECTIONS_REFUSED.inc(taken.connections_refused)
    if taken.streams:
        STREAMS.inc(taken.streams)
    for code, count in taken.resets.items():
        STREAM_RESETS.labels(ERROR_NAMES.get(code, "OTHER")).inc(count)
    for code, count in taken.terminations.items():
        CONNECTION_ENDS.labels(ERROR_NAMES.get(code, "OTHER")).inc(count)
    CONNECTIONS_OPEN.set(open_connections)


@dataclass(frozen=True)
class RunningServer:
    """The port of an in-process server started by :func:`running` (0 on a Unix socket)."""

    port: int
    http_port: int | None


class _Worker:
    """One worker's listener, connections and app."""

    def __init__(
        self,
        app: GrpcApp,
        listen: str,
        http_listen: str | None,
        tls: ListenerTlsFiles | None,
        settings: H2Settings,
    ) -> None:
        self.app = app
        self.listen = listen
        self.http_listen = http_listen
        self.tls = tls
        self.settings = settings
        self.ctx = new_worker_context(app)
        self.stats = H2Stats()
        self.port = 0
        self.http_port: int | None = None
        self.grpc: GrpcAsgiApp | None = None
        self.connections: ConnectionSet | None = None
        self._server: asyncio.AbstractServer | None = None
        self._http: HttpSide | None = None
        self._metrics: asyncio.Task[None] | None = None

    async def start(self) -> None:
        _register_zeros()
        await self.app.start(self.ctx)
        ctx = self.ctx
        self.grpc = GrpcAsgiApp(ctx.services, ctx.health, tuple(self.app.service_names))
        self.connections = connections = ConnectionSet(self.grpc, self.settings, self.stats)
        ssl_context = (
            None
            if self.tls is None
            else ReloadingServerContext(self.tls, listener="gRPC port", alpn=("h2",))
        )
        loop = asyncio.get_running_loop()
        handshake = self.settings.handshake_seconds if ssl_context is not None else None
        path = unix_listen_path(self.listen)
        if path is not None:
            _remove_stale_socket(path)
            self._server = await loop.create_unix_server(
                connections.protocol,
                path,
                ssl=ssl_context,
                ssl_handshake_timeout=handshake,
                backlog=LISTEN_BACKLOG,
            )
        else:
            self._server = await loop.create_server(
                connections.protocol,
                sock=reuseport_socket(self.listen),
                ssl=ssl_context,
                ssl_handshake_timeout=handshake,
                backlog=LISTEN_BACKLOG,
            )
            self.port = int(self._server.sockets[0].getsockname()[1])
        self._metrics = loop.create_task(self._publish_metrics())
        if self.app.http_app is not None and self.http_listen:
            self._http = HttpSide.start(self.app.http_app, self.http_listen)
            self.http_port = self._http.port

    async def _publish_metrics(self) -> None:
        while True:
            await asyncio.sleep(METRICS_FLUSH_SECONDS)
            connections = self.connections
            _publish(self.stats, len(connections.open) if connections else 0)
            if connections is not None and connections.give_back():
                trim_heap()

    async def drain(self, grace: float) -> None:
        """NOT_SERVING, stop accepting, GOAWAY, wait for the calls in flight, close."""
        ctx, grpc, connections = self.ctx, self.grpc, self.connections
        for name in (*ctx.service_names, ""):
            ctx.health.set(name, Serving.NOT_SERVING)
        # Let the Watch streams send NOT_SERVING (wake-up, then the flush) before
        # the health state closes and ends them.
        for _ in range(3):
            await asyncio.sleep(0)
        if self._server is not None:
            self._server.close()
        if connections is not None:
            connections.start_drain()
        ctx.health.close()
        if self._http is not None:
            await self._http.stop()
            self._http = None
        if grpc is not None:
            await grpc.in_flight.drain(grace)
        if connections is not None:
            connections.close_all()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_SECONDS):
                    await connections.wait_closed()
        if self._metrics is not None:
            self._metrics.cancel()
        _publish(self.stats, 0)
        await self.app.stop()


def _remove_stale_socket(path: str) -> None:
    """A socket file left by a previous run would make the bind fail (Envoy does the same)."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.stat(path).st_mode):
            os.unlink(path)


@contextlib.asynccontextmanager
async def running(
    app: GrpcApp,
    listen: str = "127.0.0.1:0",
    *,
    http_listen: str | None = None,
    grace_seconds: float = 1.0,
    tls: ListenerTlsFiles | None = None,
    settings: H2Settings | None = None,
) -> AsyncIterator[RunningServer]:
    """Run ``app`` on the h2 backend in this event loop for the duration of the block."""
    worker = _Worker(app, listen, http_listen, tls, settings or H2Settings())
    await worker.start()
    try:
        yield RunningServer(worker.port, worker.http_port)
    finally:
        await worker.drain(grace_seconds)


async def _run_worker(app: GrpcApp, options: ServeOptions, supervisor: int) -> None:
    worker = _Worker(app, options.listen, options.http_listen, options.tls, settings_from_env())
    await serve_until_stopped(worker, supervisor, options.grace_seconds, "h2")


@contextlib.contextmanager
def h2_starter(
    app_factory: Callable[[], GrpcApp], options: ServeOptions, service: str
) -> Iterator[StartWorker]:
    """The h2 :data:`~meshplane.server_contract.Backend`: spawned uvloop workers."""
    settings_from_env()  # a bad MESHPLANE_H2_* stops the supervisor, not each worker
    if options.tls is not None:
        options.tls.check_readable()
    with spawned_starter(_run_worker, app_factory, options, service, use_uvloop=True) as start:
        yield start
