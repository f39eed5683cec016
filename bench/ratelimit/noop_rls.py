"""The baselines of the rate-limit bench: an RLS that answers OK at once.

Built on our runtime (meshplane.server, ``--server`` any backend: the same
worker model, health and reflection as the service).

With ``--redis-port`` it also makes one ``GET`` round trip to that Redis per
call, on a bare asyncio protocol, before answering: the floor of any decision
that consults Redis once on this runtime. Our service's distance from this
second baseline is what its own code costs on the Redis path.

    uv run python bench/ratelimit/noop_rls.py --listen 127.0.0.1:18081 [--redis-port 6379]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
from collections import deque
from collections.abc import Sequence

import hiredis
from envoy.service.ratelimit.v3 import rls_pb2

from meshplane.server import serve
from meshplane.server_contract import SERVER_KINDS, ASGIApp, ServeOptions, WorkerContext

SERVICE = "envoy.service.ratelimit.v3.RateLimitService"
_GET = b"*2\r\n$3\r\nGET\r\n$4\r\nnoop\r\n"


class RedisGet(asyncio.Protocol):
    """One pipelined connection; replies resolve the waiting calls in order."""

    def __init__(self) -> None:
        self.reader = hiredis.Reader()
        self.waiters: deque[asyncio.Future[object]] = deque()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            self.waiters.popleft().set_result(reply)

    async def get(self) -> None:
        assert self.transport is not None
        future = asyncio.get_running_loop().create_future()
        self.waiters.append(future)
        self.transport.write(_GET)
        await future


class _Noop:
    """Answers OK for every descriptor, after one Redis GET if it has a connection."""

    def __init__(self, redis: RedisGet | None) -> None:
        self._redis = redis

    async def __call__(self, raw: bytes) -> bytes:
        if self._redis is not None:
            await self._redis.get()
        request = rls_pb2.RateLimitRequest.FromString(raw)
        response = rls_pb2.RateLimitResponse(overall_code=rls_pb2.RateLimitResponse.OK)
        for _ in request.descriptors:
            response.statuses.add(code=rls_pb2.RateLimitResponse.OK)
        return bytes(response.SerializeToString())


class NoopApp:
    service_names: Sequence[str] = (SERVICE,)
    http_app: ASGIApp | None = None

    def __init__(self, redis_port: int | None = None) -> None:
        self._redis_port = redis_port
        self._redis: RedisGet | None = None

    async def start(self, ctx: WorkerContext) -> None:
        if self._redis_port is not None:
            _, self._redis = await asyncio.get_running_loop().create_connection(
                RedisGet, "127.0.0.1", self._redis_port
            )
        ctx.add_unary(SERVICE, "ShouldRateLimit", _Noop(self._redis))

    async def stop(self) -> None:
        if self._redis is not None and self._redis.transport is not None:
            self._redis.transport.close()


def build(redis_port: int | None = None) -> NoopApp:
    return NoopApp(redis_port)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", default="127.0.0.1:18081")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--redis-port", type=int, help="one GET to 127.0.0.1:PORT per call")
    parser.add_argument("--server", choices=SERVER_KINDS, default=SERVER_KINDS[0])
    args = parser.parse_args()
    return serve(
        functools.partial(build, args.redis_port),
        ServeOptions(listen=args.listen, workers=args.workers, server=args.server),
        service="noop-rls",
    )


if __name__ == "__main__":
    sys.exit(main())
