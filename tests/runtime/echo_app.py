"""A tiny app on the shared runtime, used to test the runtime itself.

It serves grpc.health.v1-independent work through the generic handler API
(no generated stubs needed): ``/meshplane.test.Echo/Sleep`` sleeps for the
number of milliseconds in the request body and echoes it, counting calls in a
Prometheus counter so cross-worker metrics can be checked.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

import grpc
from prometheus_client import Counter

from meshplane.server import ASGIApp, WorkerContext

SERVICE = "meshplane.test.Echo"

CALLS = Counter("meshplane_test_echo_calls_total", "Echo calls", ["worker_pid"])


class EchoApp:
    service_names: Sequence[str] = (SERVICE,)
    http_app: ASGIApp | None = None

    async def start(self, ctx: WorkerContext) -> None:
        async def sleep(request: bytes, context: grpc.aio.ServicerContext) -> bytes:  # type: ignore[type-arg]
            CALLS.labels(str(os.getpid())).inc()
            await asyncio.sleep(int(request or b"0") / 1000)
            return request

        handler = grpc.method_handlers_generic_handler(
            SERVICE,
            {"Sleep": grpc.unary_unary_rpc_method_handler(sleep)},
        )
        ctx.server.add_generic_rpc_handlers((handler,))

    async def stop(self) -> None:
        return None


def make_app() -> EchoApp:
    return EchoApp()
