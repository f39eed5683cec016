"""Fixtures of the rate-limit tests: real redis-server processes, an in-process
service on a real gRPC socket, and a settable clock."""

from __future__ import annotations

import asyncio
import contextlib
import textwrap
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from meshplane.metrics import render_latest
from meshplane.servers.h2.server import running
from ratelimit import metrics as rl_metrics
from ratelimit.app import AppOptions, RateLimitApp
from ratelimit.settings import Settings
from tests.support.redis_server import RedisServer, redis_server

# 2027-01-15T08:00:10Z: ten seconds into a minute, hour and day window.
T0 = 1_800_000_010.0


class FakeClock:
    """A wall clock the test moves by hand."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


Entry = tuple[str, str]


def descriptor(*entries: Entry, hits: int | None = None) -> ratelimit_pb2.RateLimitDescriptor:
    d = ratelimit_pb2.RateLimitDescriptor()
    for key, value in entries:
        d.entries.add(key=key, value=value)
    if hits is not None:
        d.hits_addend.value = hits
    return d


def request(
    domain: str, *descriptors: ratelimit_pb2.RateLimitDescriptor | Sequence[Entry], hits: int = 0
) -> rls_pb2.RateLimitRequest:
    req = rls_pb2.RateLimitRequest(domain=domain, hits_addend=hits)
    for d in descriptors:
        req.descriptors.append(
            d if isinstance(d, ratelimit_pb2.RateLimitDescriptor) else descriptor(*d)
        )
    return req


def headers_of(response: rls_pb2.RateLimitResponse) -> dict[str, str]:
    return {h.key: h.value for h in response.response_headers_to_add}


OK = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT


def write_config(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text))
    return path


@dataclass
class Harness:
    app: RateLimitApp
    stub: rls_pb2_grpc.RateLimitServiceStub
    health: health_pb2_grpc.HealthStub
    port: int

    async def call(self, req: rls_pb2.RateLimitRequest) -> rls_pb2.RateLimitResponse:
        response: rls_pb2.RateLimitResponse = await self.stub.ShouldRateLimit(req, timeout=5)
        return response

    async def serving_status(self) -> int:
        reply = await self.health.Check(
            health_pb2.HealthCheckRequest(service="envoy.service.ratelimit.v3.RateLimitService"),
            timeout=5,
        )
        return int(reply.status)

    async def wait_serving(self, serving: bool = True, timeout: float = 10.0) -> None:
        want = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else (health_pb2.HealthCheckResponse.NOT_SERVING)
        )
        async with asyncio.timeout(timeout):
            while await self.serving_status() != want:
                await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def serve_app(
    config: Path,
    *,
    redis_url: str | None = None,
    settings: Settings | None = None,
    clock: FakeClock | None = None,
    wait_ready: bool = True,
    probe_interval: float = 0.05,
) -> AsyncIterator[Harness]:
    """The real app, in process, on a real loopback gRPC port."""
    options = AppOptions(
        config_path=str(config),
        redis_url=redis_url,
        settings=settings or Settings(store_timeout=0.5),
        reload_interval=0.05,
        probe_interval=probe_interval,
    )
    app = RateLimitApp(options, clock=clock or FakeClock())
    async with running(app) as srv, grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as channel:
        harness = Harness(
            app,
            rls_pb2_grpc.RateLimitServiceStub(channel),
            health_pb2_grpc.HealthStub(channel),
            srv.port,
        )
        if wait_ready:
            await harness.wait_serving(True)
        yield harness


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A redis-server of the test's own, for tests that pause or kill it,
    which no other test may see."""
    with redis_server() as server:
        yield server


@pytest.fixture(scope="module")
def redis_module() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


@pytest.fixture
def redis(redis_module: RedisServer) -> RedisServer:
    """A shared redis-server, emptied for each test."""
    redis_module.command("flushall")
    redis_module.command("config", "resetstat")
    return redis_module


def metric_value(name: str, labels: str) -> float:
    """The current value of one sample of this process's metrics (0 when absent).

    The service aggregates its hot-path metrics and flushes them periodically;
    flush first, so the value includes the calls just made.
    """
    rl_metrics.flush()
    text = render_latest().decode()
    wanted = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(wanted + " "):
            return float(line.split()[-1])
    return 0.0
