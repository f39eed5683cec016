"""What a worker does the same way on either backend, beside the gRPC server.

A grpcio worker (:mod:`meshplane.grpcio_server`) and an Envoy worker
(:mod:`meshplane.envoy_worker`) both serve the app's optional ASGI
``http_app`` under uvicorn in their event loop (:class:`HttpSide`), and both
freeze their startup heap once the app has started
(:func:`freeze_startup_heap`). One copy here, so the two backends cannot
drift.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import uvicorn

from meshplane.netaddr import parse_listen
from meshplane.server_contract import ASGIApp


def _reuseport_socket(listen: str) -> socket.socket:
    """A non-blocking socket bound to ``listen`` with SO_REUSEPORT (every worker binds it)."""
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
