"""A tiny app on the shared runtime, used to test the runtime itself.

It serves one raw-bytes unary method (no generated stubs needed):
``/meshplane.test.Echo/Sleep`` sleeps for the number of milliseconds in the
request body and echoes it (``fail:MSG`` answers FAILED_PRECONDITION with
MSG), counting calls in a Prometheus counter so cross-worker metrics can be
checked. ``/meshplane.test.Echo/Echo`` answers its request as is and
``/meshplane.test.Echo/Fill`` as many bytes as its request says (large
messages, for flow control).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence

from prometheus_client import Counter

from meshplane.grpc_wire import Code, RpcError
from meshplane.server_contract import ASGIApp, WorkerContext

SERVICE = "meshplane.test.Echo"

CALLS = Counter("meshplane_test_echo_calls_total", "Echo calls", ["worker_pid"])


class EchoApp:
    service_names: Sequence[str] = (SERVICE,)
    http_app: ASGIApp | None = None

    async def start(self, ctx: WorkerContext) -> None:
        async def sleep(request: bytes) -> bytes:
            CALLS.labels(str(os.getpid())).inc()
            if request.startswith(b"fail:"):
                raise RpcError(Code.FAILED_PRECONDITION, request[5:].decode())
            await asyncio.sleep(int(request or b"0") / 1000)
            return request

        async def echo(request: bytes) -> bytes:
            return request

        ctx.add_unary(SERVICE, "Sleep", sleep)

        async def fill(request: bytes) -> bytes:
            return b"x" * min(int(request or b"0"), 4 << 20)

        ctx.add_unary(SERVICE, "Echo", echo)
        ctx.add_unary(SERVICE, "Fill", fill)

    async def stop(self) -> None:
        return None


def make_app() -> EchoApp:
    return EchoApp()


def make_slow_app() -> EchoApp:
    """An app that takes 3 s to build (a slow config load on a loaded machine)."""
    time.sleep(3)
    return EchoApp()
