"""Process model of every meshplane gRPC service.

``serve()`` is the supervisor: it starts N worker processes that each bind
the same port with SO_REUSEPORT (the kernel spreads connections between
them), serves the workers' merged Prometheus metrics, restarts a worker that
dies, and on SIGTERM asks every worker to drain; a worker whose supervisor
is gone (killed outright) drains and exits by itself.

Two servers carry the same apps (``ServeOptions.server``):

- ``envoy`` (the default): each worker is an Envoy process that terminates
  HTTP/2 and TLS and runs the app in its embedded Python (pyvoy), behind the
  ASGI gRPC adapter of :mod:`meshplane.asgi_grpc`; see
  :mod:`meshplane.envoy_server` and :mod:`meshplane.envoy_worker`. About 35 µs
  of CPU a call instead of grpcio's ~240 µs;
- ``grpcio``: each worker is a spawned Python process running a ``grpc.aio``
  server (spawned, never forked: gRPC's core threads do not survive
  ``fork()``).

Apps never see the difference: they register ``bytes -> bytes`` unary
handlers and flip readiness on a :class:`~meshplane.rpc.HealthState`
(:class:`WorkerContext`). Both servers register ``grpc.health.v1.Health``
and server reflection, take the same TLS options, run the app's optional
ASGI app (``http_app``) on a second port under uvicorn, and drain the same
way: NOT_SERVING, stop accepting, let in-flight calls finish within
``grace_seconds``.

``running()`` runs a grpcio worker in-process for tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import multiprocessing
import multiprocessing.process
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import grpc
import uvicorn
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from meshplane import metrics
from meshplane.grpc_wire import RpcError
from meshplane.logging import configure_logging
from meshplane.netaddr import parse_listen
from meshplane.rpc import HealthState, Services, Serving, UnaryHandler
from meshplane.tls import TlsFiles, grpcio_credentials

log = logging.getLogger(__name__)

ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]
ServerKind = Literal["envoy", "grpcio"]
SERVER_KINDS: tuple[ServerKind, ...] = ("envoy", "grpcio")

# A worker that dies this soon after its start is not restarted: it would
# crash-loop (bad port, bad config); the supervisor exits with its code.
_STARTUP_WINDOW_SECONDS = 5.0


@dataclass(frozen=True)
class ServeOptions:
    """How a service is exposed. Defaults suit a sidecar-less Kubernetes pod."""

    listen: str = "127.0.0.1:8081"
    workers: int = 1
    metrics_listen: str | None = None
    http_listen: str | None = None
    grace_seconds: float = 5.0
    server: ServerKind = "envoy"
    tls: TlsFiles | None = None
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


@dataclass(frozen=True)
class RunningServer:
    """Ports of an in-process server started by :func:`running`."""

    port: int
    http_port: int | None


def _reuseport_socket(listen: str) -> socket.socket:
    host, port = parse_listen(listen)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.setblocking(False)
    return sock


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: the worker owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class HttpSide:
    """An app's ASGI ``http_app`` under uvicorn, in the worker's event loop."""

    port: int
    server: uvicorn.Server
    task: asyncio.Task[None]

    @classmethod
    def start(cls, app: ASGIApp, listen: str) -> HttpSide:
        sock = _reuseport_socket(listen)
        config = uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="off",
            http="httptools",
            loop="none",
            timeout_graceful_shutdown=5,
        )
        server = _EmbeddedUvicorn(config)
        task = asyncio.ensure_future(server.serve(sockets=[sock]))
        return cls(int(sock.getsockname()[1]), server, task)

    async def stop(self) -> None:
        self.server.should_exit = True
        await self.task


def new_worker_context(app: GrpcApp) -> WorkerContext:
    """A context reporting SERVING (the app may flip it back during start())."""
    ctx = WorkerContext(Services(), HealthState(), tuple(app.service_names))
    ctx.set_serving(True)
    return ctx


def _grpcio_method(handler: UnaryHandler) -> grpc.RpcMethodHandler[bytes, bytes]:
    """grpcio's side of a neutral handler: bytes through, RpcError as a status."""

    async def call(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        try:
            return await handler(request)
        except RpcError as exc:
            await context.abort(grpc.StatusCode[exc.code.name], exc.message)
            raise  # unreachable: abort raises

    return grpc.unary_unary_rpc_method_handler(call)


class _Worker:
    """One grpc.aio server (+ optional ASGI server) and the app wired into it."""

    def __init__(
        self, app: GrpcApp, listen: str, http_listen: str | None, tls: TlsFiles | None = None
    ) -> None:
        self.app = app
        self.listen = listen
        self.http_listen = http_listen
        self.tls = tls
        self.port = 0
        self.http_port: int | None = None
        self.server = grpc.aio.server(
            options=[
                ("grpc.so_reuseport", 1),
                # Recycle connections now and then, so SO_REUSEPORT's uneven
                # first split between workers evens out over time.
                ("grpc.max_connection_age_ms", 10 * 60 * 1000),
                ("grpc.max_connection_age_grace_ms", 30 * 1000),
            ]
        )
        self.health = HealthServicer()
        self.ctx = new_worker_context(app)
        self._http: HttpSide | None = None
        self._mirror: set[asyncio.Task[None]] = set()

    def _mirror_health(self, name: str, status: Serving) -> None:
        task = asyncio.ensure_future(self.health.set(name, int(status)))
        self._mirror.add(task)
        task.add_done_callback(self._mirror.discard)

    async def start(self) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.ctx.health.add_listener(self._mirror_health)
        await self.app.start(self.ctx)
        handlers = [
            grpc.method_handlers_generic_handler(
                service, {name: _grpcio_method(handler) for name, handler in methods.items()}
            )
            for service, methods in self.ctx.services.by_service().items()
        ]
        self.server.add_generic_rpc_handlers(handlers)
        reflection.enable_server_reflection(
            (
                *self.app.service_names,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            self.server,
        )
        if self.tls is not None:
            self.port = self.server.add_secure_port(self.listen, grpcio_credentials(self.tls))
        else:
            self.port = self.server.add_insecure_port(self.listen)
        if self.port == 0:
            raise OSError(f"cannot listen on {self.listen}")
        await self.server.start()
        if self.app.http_app is not None and self.http_listen:
            self._http = HttpSide.start(self.app.http_app, self.http_listen)
            self.http_port = self._http.port

    async def drain(self, grace: float) -> None:
        """NOT_SERVING, then stop taking RPCs and wait for in-flight ones."""
        for name in (*self.app.service_names, ""):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        if self._http is not None:
            self._http.server.should_exit = True
        await self.server.stop(grace)
        if self._http is not None:
            await self._http.stop()
        await self.app.stop()


@contextlib.asynccontextmanager
async def running(
    app: GrpcApp,
    listen: str = "127.0.0.1:0",
    http_listen: str | None = None,
    grace_seconds: float = 1.0,
    tls: TlsFiles | None = None,
) -> AsyncIterator[RunningServer]:
    """Run ``app`` on grpcio in this event loop for the duration of the block (tests)."""
    worker = _Worker(app, listen, http_listen, tls)
    await worker.start()
    try:
        yield RunningServer(worker.port, worker.http_port)
    finally:
        await worker.drain(grace_seconds)


#: How often a worker checks that its supervisor is still there.
SUPERVISOR_CHECK_SECONDS = 1.0

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux).

    Called first thing in a worker, so a supervisor killed while the worker
    is still starting is noticed too; the caller then checks that the
    parent is still the expected one (it may have died before this call).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


async def _run_worker(app: GrpcApp, options: ServeOptions, supervisor: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watch = loop.create_task(_watch_supervisor(supervisor, stop))
    worker = _Worker(app, options.listen, options.http_listen, options.tls)
    await worker.start()
    _freeze_startup_heap()
    log.info(
        "worker serving",
        extra={"grpc_port": worker.port, "http_port": worker.http_port, "server": "grpcio"},
    )
    await stop.wait()
    watch.cancel()
    log.info("worker draining", extra={"grace_seconds": options.grace_seconds})
    await worker.drain(options.grace_seconds)
    log.info("worker stopped")


async def _watch_supervisor(supervisor: int, stop: asyncio.Event) -> None:
    """Drain and exit when the supervisor is gone (as gunicorn's workers do).

    A supervisor killed outright (SIGKILL, the OOM killer) cannot stop its
    workers. Left alone they would go on serving on the shared port with
    whatever config they had, next to the workers of the supervisor that
    replaces it (SO_REUSEPORT lets both bind). ``supervisor`` is the pid the
    supervisor passed in, not ``os.getppid()`` read here: a worker is slow
    to start (imports, config, app start), and a supervisor that died
    meanwhile would have made the orphan's new parent look like the
    supervisor. The parent-death signal (:func:`die_with_parent`) usually
    gets there first; this check covers what it cannot (non-Linux).
    """
    while not stop.is_set():
        if os.getppid() != supervisor:
            log.warning("supervisor gone; draining", extra={"supervisor_pid": supervisor})
            stop.set()
            return
        await asyncio.sleep(SUPERVISOR_CHECK_SECONDS)


def _freeze_startup_heap() -> None:
    """Keep the objects that live as long as the worker out of every GC pass.

    After startup the heap holds tens of thousands of long-lived objects
    (protobuf descriptors, the gRPC runtime, config, compiled policies). A
    full collection walks all of them: measured at ~23 ms on these machines,
    a stall of the whole event loop that shows as a p99.9 spike and, on the
    rate-limit service, as store-call timeouts. ``gc.freeze()`` moves them to
    the permanent generation, so collections only walk what requests create.
    Later garbage (a reloaded config) is still collected as usual.
    """
    gc.collect()
    gc.freeze()


def _worker_main(
    app_factory: Callable[[], GrpcApp], options: ServeOptions, service: str, supervisor: int
) -> None:
    """Entry point of a spawned grpcio worker process."""
    # SIGTERM (a drain) as soon as the supervisor dies, even mid-start; and
    # if it died before this line, do not start at all.
    die_with_parent(signal.SIGTERM)
    if os.getppid() != supervisor:
        return
    configure_logging(service)
    # SIGINT from a terminal reaches the whole process group; the supervisor
    # turns it into an orderly SIGTERM, so workers ignore the raw one until
    # their loop installs its handlers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        asyncio.run(_run_worker(app_factory(), options, supervisor))
    except Exception:
        log.exception("worker failed")
        raise SystemExit(1) from None


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


class _SpawnedWorker:
    """A grpcio worker: a spawned Python process, drained by SIGTERM."""

    def __init__(self, process: multiprocessing.process.BaseProcess) -> None:
        self.process = process

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def exitcode(self) -> int | None:
        return self.process.exitcode

    def is_alive(self) -> bool:
        return self.process.is_alive()

    def request_drain(self) -> None:
        if self.process.is_alive() and self.process.pid is not None:
            os.kill(self.process.pid, signal.SIGTERM)

    def join(self, timeout: float) -> None:
        self.process.join(timeout)

    def kill(self) -> None:
        self.process.kill()


@dataclass
class _Slot:
    index: int
    process: WorkerProcess
    started: float


StartWorker = Callable[[int], WorkerProcess]


def _grpcio_starter(
    app_factory: Callable[[], GrpcApp], options: ServeOptions, service: str
) -> StartWorker:
    ctx = multiprocessing.get_context("spawn")
    supervisor = os.getpid()

    def start(index: int) -> WorkerProcess:
        proc = ctx.Process(
            target=_worker_main,
            args=(app_factory, options, service, supervisor),
            name=f"{service}-worker-{index}",
        )
        proc.start()
        return _SpawnedWorker(proc)

    return start


def serve(app_factory: Callable[[], GrpcApp], options: ServeOptions, *, service: str) -> int:
    """Run the supervisor until SIGTERM/SIGINT; return the process exit code."""
    configure_logging(service)
    if options.workers < 1:
        raise ValueError("workers must be at least 1")
    metrics_dir = metrics.prepare_multiprocess_dir(service)
    if options.metrics_listen:
        port = metrics.start_metrics_server(options.metrics_listen)
        log.info("metrics endpoint up", extra={"listen": options.metrics_listen, "port": port})

    stopping = False

    def request_stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

    with contextlib.ExitStack() as resources:
        if options.server == "envoy":
            from meshplane.envoy_server import envoy_starter  # noqa: PLC0415 - imports pyvoy

            start_worker = resources.enter_context(envoy_starter(app_factory, options, service))
        else:
            start_worker = _grpcio_starter(app_factory, options, service)
        exit_code = _supervise(start_worker, options, service, lambda: stopping)
    metrics.cleanup_multiprocess_dir(metrics_dir)
    log.info("supervisor stopped", extra={"exit_code": exit_code})
    return exit_code


def _supervise(
    start_worker: StartWorker, options: ServeOptions, service: str, stopping: Callable[[], bool]
) -> int:
    """Keep N workers up until ``stopping()``; drain them; the exit code."""
    slots = [_Slot(i, start_worker(i), time.monotonic()) for i in range(options.workers)]
    log.info(
        "supervisor started",
        extra={
            "workers": options.workers,
            "listen": options.listen,
            "http": options.http_listen,
            "server": options.server,
            "tls": options.tls is not None,
            "mtls": options.tls is not None and options.tls.client_ca is not None,
        },
    )
    exit_code = 0
    failed = False
    try:
        while not (failed or stopping()):
            time.sleep(0.2)
            for i, slot in enumerate(slots):
                if slot.process.is_alive() or stopping():
                    continue
                code = slot.process.exitcode or 0
                pid = slot.process.pid
                if pid is not None:
                    metrics.mark_worker_dead(pid)
                if time.monotonic() - slot.started < _STARTUP_WINDOW_SECONDS:
                    log.error(
                        "worker failed during startup; stopping",
                        extra={"worker": slot.index, "exit_code": code},
                    )
                    exit_code = code or 1
                    failed = True
                    break
                log.warning(
                    "worker exited; restarting", extra={"worker": slot.index, "exit_code": code}
                )
                slots[i] = _Slot(slot.index, start_worker(slot.index), time.monotonic())
    finally:
        _stop_workers(slots, options.grace_seconds)
    for slot in slots:
        if slot.process.exitcode not in (0, None) and exit_code == 0:
            exit_code = 1
    return exit_code


def _stop_workers(slots: list[_Slot], grace: float) -> None:
    for slot in slots:
        if slot.process.is_alive():
            slot.process.request_drain()
    deadline = time.monotonic() + grace + 5.0
    for slot in slots:
        slot.process.join(max(0.0, deadline - time.monotonic()))
        if slot.process.is_alive():
            log.error("worker did not drain in time; killing", extra={"worker": slot.index})
            slot.process.kill()
            slot.process.join(2.0)
