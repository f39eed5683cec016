"""The grpcio backend: each worker is a spawned Python process running ``grpc.aio``.

Spawned, never forked: gRPC's core threads do not survive ``fork()``. A
worker registers ``grpc.health.v1.Health`` and server reflection beside the
app's handlers, mirrors the app's :class:`~meshplane.rpc.HealthState` into
grpcio's health servicer, and drains on SIGTERM: NOT_SERVING, stop
accepting, let in-flight calls finish within ``grace_seconds``. A worker
whose supervisor is gone (killed outright) drains and exits by itself.

:func:`running` runs a worker in the caller's event loop, for tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from meshplane.grpc_wire import RpcError
from meshplane.rpc import Serving, StreamHandler, UnaryHandler, set_trace_context
from meshplane.server_contract import (
    GrpcApp,
    ServeOptions,
    StartWorker,
    new_worker_context,
)
from meshplane.tls import ListenerTlsFiles, grpcio_credentials
from meshplane.worker_support import (
    HttpSide,
    serve_until_stopped,
    spawned_starter,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunningServer:
    """Ports of an in-process server started by :func:`running`."""

    port: int
    http_port: int | None


def _grpcio_method(handler: UnaryHandler) -> grpc.RpcMethodHandler[bytes, bytes]:
    """grpcio's side of a neutral handler: bytes through, RpcError as a status."""

    async def call(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        try:
            return await handler(request)
        except RpcError as exc:
            await context.abort(grpc.StatusCode[exc.code.name], exc.message)
            raise  # unreachable: abort raises

    async def traced_call(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        metadata = dict(context.invocation_metadata() or ())
        traceparent, tracestate = metadata.get("traceparent"), metadata.get("tracestate")
        set_trace_context(
            None if traceparent is None else str(traceparent),
            None if tracestate is None else str(tracestate),
        )
        return await call(request, context)

    # Reading metadata costs on every call: only a handler that uses it pays.
    wants = getattr(handler, "wants_trace_context", False)
    return grpc.unary_unary_rpc_method_handler(traced_call if wants else call)


def _grpcio_stream(handler: StreamHandler) -> grpc.RpcMethodHandler[bytes, bytes]:
    """grpcio's side of a bidirectional stream: requests in, ``context.write`` out."""

    async def call(
        requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> None:
        try:
            await handler(requests, context.write)
        except RpcError as exc:
            await context.abort(grpc.StatusCode[exc.code.name], exc.message)

    return grpc.stream_stream_rpc_method_handler(call)


class _Worker:
    """One grpc.aio server (+ optional ASGI server) and the app wired into it."""

    def __init__(
        self,
        app: GrpcApp,
        listen: str,
        http_listen: str | None,
        tls: ListenerTlsFiles | None = None,
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
        handlers += [
            grpc.method_handlers_generic_handler(
                service, {name: _grpcio_stream(handler) for name, handler in methods.items()}
            )
            for service, methods in self.ctx.services.streams_by_service().items()
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
        # As the other backends do: the app sees its health state close (its
        # long-lived streams end on it) while in-flight calls may still finish.
        self.ctx.health.close()
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
    tls: ListenerTlsFiles | None = None,
) -> AsyncIterator[RunningServer]:
    """Run ``app`` on grpcio in this event loop for the duration of the block (tests)."""
    worker = _Worker(app, listen, http_listen, tls)
    await worker.start()
    try:
        yield RunningServer(worker.port, worker.http_port)
    finally:
        await worker.drain(grace_seconds)


async def _run_worker(app: GrpcApp, options: ServeOptions, supervisor: int) -> None:
    worker = _Worker(app, options.listen, options.http_listen, options.tls)
    await serve_until_stopped(worker, supervisor, options.grace_seconds, "grpcio")


@contextlib.contextmanager
def grpcio_starter(
    app_factory: Callable[[], GrpcApp], options: ServeOptions, service: str
) -> Iterator[StartWorker]:
    """The grpcio :data:`~meshplane.server_contract.Backend`: workers share nothing on disk."""
    # The default asyncio loop: grpc.aio drives its own completion queue on it.
    with spawned_starter(_run_worker, app_factory, options, service, use_uvloop=False) as start:
        yield start
