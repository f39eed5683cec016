"""What a worker does the same way on every backend, beside the gRPC server.

An h2 worker (:mod:`meshplane.servers.h2.server`) and an Envoy worker
(:mod:`meshplane.servers.envoy.worker`) both serve the app's optional ASGI
``http_app`` under uvicorn in their event loop (:class:`HttpSide`), and both
freeze their startup heap once the app has started (:func:`freeze_startup_heap`).
The h2 backend's workers are spawned Python processes, so the module also
holds how such a worker is started, tied to its supervisor's life and drained
(:func:`spawned_starter`, :func:`die_with_parent`, :func:`watch_supervisor`).
One copy here, so the backends cannot drift.
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
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import uvicorn

from meshplane.logging import configure_logging
from meshplane.netaddr import parse_listen
from meshplane.parent_death import die_with_parent
from meshplane.server_contract import ASGIApp, GrpcApp, ServeOptions, StartWorker, WorkerProcess

log = logging.getLogger(__name__)


def reuseport_socket(listen: str) -> socket.socket:
    """A non-blocking socket bound to ``listen`` with SO_REUSEPORT (every worker binds it)."""
    host, port = parse_listen(listen)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.setblocking(False)
    return sock


#: How often a worker checks that its supervisor is still there.
SUPERVISOR_CHECK_SECONDS = 1.0


async def watch_supervisor(supervisor: int, stop: asyncio.Event) -> None:
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


class ServedWorker(Protocol):
    """A spawned worker's server (h2's): started, then drained."""

    port: int
    http_port: int | None

    async def start(self) -> None: ...

    async def drain(self, grace: float) -> None: ...


async def serve_until_stopped(
    worker: ServedWorker, supervisor: int, grace: float, server: str
) -> None:
    """The life of a spawned worker, the same for every backend that spawns them:
    start, freeze the startup heap, serve until SIGTERM/SIGINT (the supervisor's
    drain) or the supervisor's death, then drain within ``grace`` seconds."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watch = loop.create_task(watch_supervisor(supervisor, stop))
    await worker.start()
    freeze_startup_heap()
    log.info(
        "worker serving",
        extra={"grpc_port": worker.port, "http_port": worker.http_port, "server": server},
    )
    await stop.wait()
    watch.cancel()
    log.info("worker draining", extra={"grace_seconds": grace})
    await worker.drain(grace)
    log.info("worker stopped")


#: A spawned worker's body: ``(app, options, supervisor pid)``, run in the worker's
#: event loop until the worker has drained. A module-level function (spawn pickles it).
RunWorker = Callable[[GrpcApp, ServeOptions, int], Coroutine[Any, Any, None]]


@dataclass(frozen=True)
class _SpawnSpec:
    """What a spawned worker is given (pickled by multiprocessing's spawn)."""

    run_worker: RunWorker
    app_factory: Callable[[], GrpcApp]
    options: ServeOptions
    service: str
    supervisor: int
    use_uvloop: bool


def _spawned_main(spec: _SpawnSpec) -> None:
    """Entry point of a spawned worker process (h2)."""
    # SIGTERM (a drain) as soon as the supervisor dies, even mid-start; and
    # if it died before this line, do not start at all.
    die_with_parent(signal.SIGTERM)
    if os.getppid() != spec.supervisor:
        return
    configure_logging(spec.service)
    # SIGINT from a terminal reaches the whole process group; the supervisor
    # turns it into an orderly SIGTERM, so workers ignore the raw one until
    # their loop installs its handlers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        main = spec.run_worker(spec.app_factory(), spec.options, spec.supervisor)
        if spec.use_uvloop:
            import uvloop  # noqa: PLC0415 - only the backends that want it pay the import

            uvloop.run(main)
        else:
            asyncio.run(main)
    except Exception:
        log.exception("worker failed")
        raise SystemExit(1) from None


class SpawnedWorker:
    """A spawned worker Python process as the supervisor sees it, drained by SIGTERM."""

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


@contextlib.contextmanager
def spawned_starter(
    run_worker: RunWorker,
    app_factory: Callable[[], GrpcApp],
    options: ServeOptions,
    service: str,
    *,
    use_uvloop: bool,
) -> Iterator[StartWorker]:
    """A backend whose workers are spawned Python processes running ``run_worker``.

    Spawned, never forked: gRPC's core threads do not survive ``fork()``, and a
    forked copy of the supervisor's state (signal handlers, the metrics
    thread) is not what a worker wants. The workers share nothing on disk.
    """
    ctx = multiprocessing.get_context("spawn")
    supervisor = os.getpid()

    def start(index: int) -> WorkerProcess:
        proc = ctx.Process(
            target=_spawned_main,
            args=(_SpawnSpec(run_worker, app_factory, options, service, supervisor, use_uvloop),),
            name=f"{service}-worker-{index}",
        )
        proc.start()
        return SpawnedWorker(proc)

    yield start


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
        sock = reuseport_socket(listen)
        config = uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="off",
            http="httptools",
            loop="none",
            timeout_graceful_shutdown=5,
        )
        # Listening now, not when uvicorn's task first runs: the worker reports
        # this port as served at once, and a connection made before the task
        # runs then waits in the backlog instead of being refused.
        sock.listen(config.backlog)
        server = _EmbeddedUvicorn(config)
        task = asyncio.ensure_future(server.serve(sockets=[sock]))
        return cls(int(sock.getsockname()[1]), server, task)

    async def stop(self) -> None:
        self.server.should_exit = True
        await self.task


def trim_heap() -> None:
    """glibc's ``malloc_trim(0)``: free heap pages go back to the system (a no-op
    where the C library is not glibc). Called once most of a large peak of
    buffered request bytes is released: glibc keeps freed bodies' pages, which
    stayed resident, hundreds of MiB, after the peers that sent them were gone."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def freeze_startup_heap() -> None:
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
