"""Process model of every meshplane gRPC service.

``serve()`` is the supervisor: it spawns N worker processes that each bind the
same port with SO_REUSEPORT (the kernel spreads connections between them),
serves the workers' merged Prometheus metrics, restarts a worker that dies,
and on SIGTERM asks every worker to drain; a worker whose supervisor is gone
(killed outright) drains and exits by itself. Workers are *spawned*, never
forked, because gRPC's core threads do not survive ``fork()``.

Each worker runs one ``grpc.aio`` server with ``grpc.health.v1`` and server
reflection registered for the app's services, plus, if the app has one, an
ASGI app on a second port (also SO_REUSEPORT) in the same event loop. On
SIGTERM a worker reports NOT_SERVING, stops accepting new RPCs and lets
in-flight ones finish within ``grace_seconds``.

``running()`` runs the same worker in-process for tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import multiprocessing
import multiprocessing.process
import os
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc
import uvicorn
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from meshplane import metrics
from meshplane.logging import configure_logging
from meshplane.netaddr import parse_listen

log = logging.getLogger(__name__)

ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]

# A worker that dies this soon after its start is not restarted: it would
# crash-loop (bad port, bad config); the supervisor exits with its code.
_STARTUP_WINDOW_SECONDS = 5.0


@dataclass(frozen=True)
class ServeOptions:
    """How a service is exposed. Defaults suit a sidecar-less Kubernetes pod."""

    listen: str = "0.0.0.0:8081"
    workers: int = 1
    metrics_listen: str | None = None
    http_listen: str | None = None
    grace_seconds: float = 5.0


@dataclass
class WorkerContext:
    """What an app gets to wire itself into a worker."""

    server: grpc.aio.Server
    health: HealthServicer
    service_names: Sequence[str]
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def set_serving(self, serving: bool) -> None:
        """Flip readiness of every service of this worker (and the overall "")."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in (*self.service_names, ""):
            task = asyncio.get_running_loop().create_task(self.health.set(name, status))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)


class GrpcApp(Protocol):
    """One worker's application."""

    service_names: Sequence[str]
    http_app: ASGIApp | None

    async def start(self, ctx: WorkerContext) -> None:
        """Add servicers to ``ctx.server`` and start background tasks."""

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


class _Worker:
    """One gRPC server (+ optional ASGI server) and the app wired into it."""

    def __init__(self, app: GrpcApp, listen: str, http_listen: str | None) -> None:
        self.app = app
        self.listen = listen
        self.http_listen = http_listen
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
        self.ctx = WorkerContext(self.server, self.health, tuple(app.service_names))
        self._http: _EmbeddedUvicorn | None = None
        self._http_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.ctx.set_serving(True)  # the app may flip it back during start()
        await self.app.start(self.ctx)
        reflection.enable_server_reflection(
            (
                *self.app.service_names,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            self.server,
        )
        self.port = self.server.add_insecure_port(self.listen)
        if self.port == 0:
            raise OSError(f"cannot listen on {self.listen}")
        await self.server.start()
        if self.app.http_app is not None and self.http_listen:
            sock = _reuseport_socket(self.http_listen)
            self.http_port = int(sock.getsockname()[1])
            config = uvicorn.Config(
                self.app.http_app,
                log_config=None,
                access_log=False,
                lifespan="off",
                http="httptools",
                loop="none",
                timeout_graceful_shutdown=5,
            )
            self._http = _EmbeddedUvicorn(config)
            self._http_task = asyncio.create_task(self._http.serve(sockets=[sock]))

    async def drain(self, grace: float) -> None:
        """NOT_SERVING, then stop taking RPCs and wait for in-flight ones."""
        for name in (*self.app.service_names, ""):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        if self._http is not None:
            self._http.should_exit = True
        await self.server.stop(grace)
        if self._http_task is not None:
            await self._http_task
        await self.app.stop()


@contextlib.asynccontextmanager
async def running(
    app: GrpcApp,
    listen: str = "127.0.0.1:0",
    http_listen: str | None = None,
    grace_seconds: float = 1.0,
) -> AsyncIterator[RunningServer]:
    """Run ``app`` in this event loop for the duration of the block (tests)."""
    worker = _Worker(app, listen, http_listen)
    await worker.start()
    try:
        yield RunningServer(worker.port, worker.http_port)
    finally:
        await worker.drain(grace_seconds)


#: How often a worker checks that its supervisor is still there.
SUPERVISOR_CHECK_SECONDS = 1.0


async def _run_worker(app: GrpcApp, options: ServeOptions) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watch = loop.create_task(_watch_supervisor(os.getppid(), stop))
    worker = _Worker(app, options.listen, options.http_listen)
    await worker.start()
    _freeze_startup_heap()
    log.info(
        "worker serving",
        extra={"grpc_port": worker.port, "http_port": worker.http_port},
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
    replaces it (SO_REUSEPORT lets both bind). The orphan's parent changes,
    which is checked here every SUPERVISOR_CHECK_SECONDS.
    """
    while not stop.is_set():
        await asyncio.sleep(SUPERVISOR_CHECK_SECONDS)
        if os.getppid() != supervisor:
            log.warning("supervisor gone; draining", extra={"supervisor_pid": supervisor})
            stop.set()


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


def _worker_main(app_factory: Callable[[], GrpcApp], options: ServeOptions, service: str) -> None:
    """Entry point of a spawned worker process."""
    configure_logging(service)
    # SIGINT from a terminal reaches the whole process group; the supervisor
    # turns it into an orderly SIGTERM, so workers ignore the raw one until
    # their loop installs its handlers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        asyncio.run(_run_worker(app_factory(), options))
    except Exception:
        log.exception("worker failed")
        raise SystemExit(1) from None


@dataclass
class _Slot:
    index: int
    process: multiprocessing.process.BaseProcess
    started: float


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

    ctx = multiprocessing.get_context("spawn")

    def start_slot(index: int) -> _Slot:
        proc = ctx.Process(
            target=_worker_main,
            args=(app_factory, options, service),
            name=f"{service}-worker-{index}",
        )
        proc.start()
        return _Slot(index, proc, time.monotonic())

    slots = [start_slot(i) for i in range(options.workers)]
    log.info(
        "supervisor started",
        extra={"workers": options.workers, "listen": options.listen, "http": options.http_listen},
    )
    exit_code = 0
    try:
        while not stopping:
            time.sleep(0.2)
            for i, slot in enumerate(slots):
                if slot.process.is_alive() or stopping:
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
                    stopping = True
                    break
                log.warning(
                    "worker exited; restarting", extra={"worker": slot.index, "exit_code": code}
                )
                slots[i] = start_slot(slot.index)
    finally:
        _stop_workers(slots, options.grace_seconds)
        metrics.cleanup_multiprocess_dir(metrics_dir)
    for slot in slots:
        if slot.process.exitcode not in (0, None) and exit_code == 0:
            exit_code = 1
    log.info("supervisor stopped", extra={"exit_code": exit_code})
    return exit_code


def _stop_workers(slots: list[_Slot], grace: float) -> None:
    for slot in slots:
        if slot.process.is_alive() and slot.process.pid is not None:
            os.kill(slot.process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace + 5.0
    for slot in slots:
        slot.process.join(max(0.0, deadline - time.monotonic()))
        if slot.process.is_alive():
            log.error("worker did not drain in time; killing", extra={"worker": slot.index})
            slot.process.kill()
            slot.process.join(2.0)
