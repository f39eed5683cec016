"""Exact atomicity across processes: 200 concurrent calls against 100/minute,
spread over two service processes started with the real CLI and sharing one
Redis, give exactly 100 OK."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from envoy.service.ratelimit.v3 import rls_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.ratelimit.conftest import OK, OVER, request, write_config
from tests.support.net import free_port
from tests.support.redis_server import RedisServer

RATELIMIT_CLI = str(Path(sys.executable).parent / "ratelimit")


def start_cli(config: Path, port: int, redis_url: str, *extra: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env["REDIS_URL"] = redis_url  # the environment variable path of the URL
    return subprocess.Popen(
        [RATELIMIT_CLI, "serve", "--config", str(config), "--listen", f"127.0.0.1:{port}",
         "--grace-seconds", "1", *extra],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip


async def wait_serving(port: int, timeout: float = 30.0) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + timeout
        while True:
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"service on {port} never became SERVING")
            await asyncio.sleep(0.1)


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(20)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.fixture
def two_services(tmp_path: Path, redis: RedisServer) -> Iterator[tuple[int, int]]:
    config = write_config(
        tmp_path,
        "atom.yaml",
        """\
        domain: atom
        descriptors:
          - key: client
            rate_limit: {unit: minute, requests_per_unit: 100}
        """,
    )
    ports = free_port(), free_port()
    # A generous store timeout: this test is about exact counting on a busy
    # 2-core machine, not about latency (an answer that times out may still
    # have been counted, by design).
    procs = [start_cli(config, p, redis.url, "--store-timeout-ms", "2000") for p in ports]
    try:
        yield ports
    finally:
        codes = [stop(p) for p in procs]
        assert codes == [0, 0]


async def test_200_concurrent_calls_across_two_processes_give_exactly_100_ok(
    two_services: tuple[int, int],
) -> None:
    for port in two_services:
        await wait_serving(port)
    # Stay clear of a minute boundary: a turning window would refill the bucket.
    into_minute = time.time() % 60
    if into_minute > 45:
        await asyncio.sleep(60.5 - into_minute)
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{p}") for p in two_services]
    try:
        stubs = [rls_pb2_grpc.RateLimitServiceStub(c) for c in channels]
        req = request("atom", [("client", "shared")])
        responses = await asyncio.gather(
            *(stubs[i % 2].ShouldRateLimit(req, timeout=20) for i in range(200))
        )
    finally:
        for channel in channels:
            await channel.close()
    codes = [r.overall_code for r in responses]
    assert codes.count(OK) == 100
    assert codes.count(OVER) == 100
    remaining = sorted(r.statuses[0].limit_remaining for r in responses if r.overall_code == OK)
    assert remaining == list(range(100))  # every OK saw a distinct counter value


def test_bad_config_at_start_exits_2_naming_file_line_and_field(tmp_path: Path) -> None:
    bad = write_config(
        tmp_path,
        "bad.yaml",
        """\
        domain: broken
        descriptors:
          - key: client
            rate_limit: {unit: fortnight, requests_per_unit: 1}
        """,
    )
    result = subprocess.run(
        [RATELIMIT_CLI, "serve", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert f"{bad}:4: descriptors[0].rate_limit.unit: invalid rate limit unit" in result.stderr
