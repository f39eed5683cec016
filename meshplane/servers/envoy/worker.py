"""The Envoy backend, worker's side: runs inside Envoy's interpreter.

pyvoy imports ``app`` from here in each Envoy process (see
:mod:`meshplane.servers.envoy.server`) and drives it over ASGI on its event loop
(uvloop), in a thread of Envoy's; Envoy owns the process and its signals.

- **Startup** is ASGI lifespan: read the spec the supervisor left, set up
  JSON logs, build and start the app (the same ``GrpcApp`` h2 runs),
  serve its optional ``http_app`` under uvicorn, freeze the startup heap. A
  failure here exits the process with code 1, which the supervisor reports
  as a worker failing at startup.
- **Calls** go straight to :class:`meshplane.asgi_grpc.GrpcAsgiApp`. A call
  that arrives before the app has started gets UNAVAILABLE.
- **Drain** starts on ``drain`` from the supervisor, or when the control
  channel reaches end-of-file (the supervisor is gone, even if it went
  before this worker started): every service NOT_SERVING, Envoy stops
  listening (admin ``/drain_listeners``), Watch streams end, in-flight calls
  finish within ``grace_seconds``; then the worker sends itself SIGTERM,
  Envoy shuts down, and lifespan shutdown stops the app (metrics flushed,
  Redis closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from typing import Any

from meshplane.asgi_grpc import GrpcAsgiApp, Receive, Scope, Send
from meshplane.grpc_wire import Code
from meshplane.logging import configure_logging
from meshplane.rpc import Serving
from meshplane.server_contract import GrpcApp, WorkerContext, new_worker_context
from meshplane.servers.envoy.server import (
    DRAIN,
    ENV_CONTROL_FD,
    MAX_HELD_REQUEST_BYTES,
    WorkerSpec,
    admin_post,
    load_spec,
)
from meshplane.worker_support import HttpSide, freeze_startup_heap, trim_heap

log = logging.getLogger(__name__)


class EnvoyWorkerApp:
    """The ASGI app pyvoy runs: lifespan around one ``GrpcApp``."""

    def __init__(self) -> None:
        self.grpc: GrpcAsgiApp | None = None
        self._spec: WorkerSpec | None = None
        self._app: GrpcApp | None = None
        self._ctx: WorkerContext | None = None
        self._http: HttpSide | None = None
        self._control: socket.socket | None = None
        self._draining: asyncio.Task[None] | None = None
        self._trimming: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif self.grpc is None:
            await _not_ready(send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self._start()
                except BaseException:
                    log.exception("worker failed")
                    _exit_now(1)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self._stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _start(self) -> None:
        spec = load_spec()
        self._spec = spec
        configure_logging(spec.service)
        loop = asyncio.get_running_loop()
        control = socket.socket(fileno=int(os.environ[ENV_CONTROL_FD]))
        control.setblocking(False)
        self._control = control
        loop.add_reader(control.fileno(), self._on_control)
        app = spec.app_factory()
        ctx = new_worker_context(app)
        await app.start(ctx)
        self._app, self._ctx = app, ctx
        self.grpc = GrpcAsgiApp(
            ctx.services,
            ctx.health,
            tuple(app.service_names),
            max_held_request_bytes=MAX_HELD_REQUEST_BYTES,
        )
        if app.http_app is not None and spec.options.http_listen:
            self._http = HttpSide.start(app.http_app, spec.options.http_listen)
        self._trimming = loop.create_task(self._give_back_heap(self.grpc))
        freeze_startup_heap()
        log.info(
            "worker serving",
            extra={
                "listen": spec.options.listen,
                "http_port": self._http.port if self._http else None,
                "server": "envoy",
            },
        )

    def _on_control(self) -> None:
        assert self._control is not None
        try:
            data = self._control.recv(64)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data and DRAIN not in data:
            return
        asyncio.get_running_loop().remove_reader(self._control.fileno())
        reason = "drain requested" if data else "supervisor gone"
        if self._draining is None:
            self._draining = asyncio.ensure_future(self._drain(reason))

    async def _drain(self, reason: str) -> None:
        spec, ctx, grpc = self._spec, self._ctx, self.grpc
        assert spec is not None and ctx is not None and grpc is not None
        grace = spec.options.grace_seconds
        log.info("worker draining", extra={"reason": reason, "grace_seconds": grace})
        for name in (*ctx.service_names, ""):
            ctx.health.set(name, Serving.NOT_SERVING)
        try:
            await asyncio.to_thread(admin_post, spec.admin_socket, "/drain_listeners?inboundonly")
        except OSError as exc:
            log.warning("could not stop Envoy's listener", extra={"error": str(exc)})
        ctx.health.close()
        if self._http is not None:
            await self._http.stop()
            self._http = None
        await grpc.in_flight.drain(grace)
        os.kill(os.getpid(), signal.SIGTERM)  # Envoy shuts down, then lifespan shutdown

    async def _give_back_heap(self, grpc: GrpcAsgiApp) -> None:
        """Each second: once the held bodies of a large peak are gone, the freed heap
        goes back to the system (Envoy's own heap: ``memory_allocator_manager``)."""
        while True:
            await asyncio.sleep(1.0)
            if grpc.held is not None and grpc.held.give_back():
                trim_heap()

    async def _stop(self) -> None:
        if self._trimming is not None:
            self._trimming.cancel()
        if self._http is not None:
            await self._http.stop()
        if self._app is not None:
            await self._app.stop()
        log.info("worker stopped")
        for handler in logging.getLogger().handlers:
            handler.flush()


async def _not_ready(send: Send) -> None:
    headers = [
        (b"content-type", b"application/grpc"),
        (b"grpc-status", str(int(Code.UNAVAILABLE)).encode()),
        (b"grpc-message", b"worker starting"),
    ]
    with contextlib.suppress(Exception):
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _exit_now(code: int) -> None:
    """End the whole Envoy process (the app cannot serve); logs flushed first."""
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    sys.stderr.flush()
    os._exit(code)


def _entry(worker: EnvoyWorkerApp) -> Any:
    """The function pyvoy calls for every stream: straight into the gRPC adapter
    once the app has started (one call frame less on the hot path)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        grpc = worker.grpc
        if grpc is not None and scope["type"] == "http":
            await grpc(scope, receive, send)
        else:
            await worker(scope, receive, send)

    return app


worker = EnvoyWorkerApp()
app = _entry(worker)
