"""Redis going away: bounded waits, the breaker, failure modes, readiness, and
recovery when a redis-server is killed and restarted mid-run."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from ratelimit.settings import FailureMode, Settings
from tests.ratelimit.conftest import (
    OK,
    OVER,
    headers_of,
    metric_value,
    request,
    serve_app,
    write_config,
)
from tests.support.net import free_port
from tests.support.processes import eventually
from tests.support.redis_server import RedisServer

CONFIG = """\
domain: out
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 5, name: shadowed}
"""
MINUTE, HOUR = 2, 3  # RateLimitResponse.RateLimit.Unit


def settings(mode: FailureMode = "unavailable") -> Settings:
    return Settings(
        failure_mode=mode,
        store_timeout=0.2,
        breaker_failures=2,
        breaker_open_seconds=0.3,
        breaker_min_streak_seconds=0.05,
    )


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return write_config(tmp_path, "out.yaml", CONFIG)


async def test_redis_killed_and_restarted_mid_run(config: Path, private_redis: RedisServer) -> None:
    async with serve_app(config, redis_url=private_redis.url, settings=settings()) as svc:
        results: Counter[str] = Counter()
        stop = asyncio.Event()

        async def load() -> None:
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    resp = await svc.call(request("out", [("client", f"c{i % 7}")]))
                    results["ok" if resp.overall_code == OK else "over"] += 1
                except grpc.aio.AioRpcError as exc:
                    results[exc.code().name] += 1
                await asyncio.sleep(0.005)

        task = asyncio.create_task(load())
        await eventually(lambda: results["ok"] > 0, 30, "calls answered")
        breaker_before = metric_value(
            "meshplane_ratelimit_store_errors_total", 'reason="breaker_open"'
        )
        private_redis.kill()
        await svc.wait_serving(False)
        unavailable_before = results["UNAVAILABLE"]
        await eventually(lambda: results["UNAVAILABLE"] > unavailable_before, 30, "refusals")
        # While Redis is down most calls are refused by the open breaker, not by a wait.
        await eventually(
            lambda: (
                metric_value("meshplane_ratelimit_store_errors_total", 'reason="breaker_open"')
                > breaker_before
            ),
            30,
            "calls refused by the open breaker",
        )
        private_redis.start()  # same port, empty, and without our script loaded
        await svc.wait_serving(True)
        ok_before = results["ok"]
        await eventually(lambda: results["ok"] > ok_before, 30, "calls answered again")
        stop.set()
        await task
        assert set(results) <= {"ok", "UNAVAILABLE"}


async def test_startup_without_redis_does_not_crash_and_becomes_ready_later(
    config: Path,
) -> None:
    port = free_port()
    server = RedisServer(port)
    try:
        async with serve_app(
            config, redis_url=server.url, settings=settings(), wait_ready=False
        ) as svc:
            await svc.wait_serving(False)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await svc.call(request("out", [("client", "a")]))
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            server.start()
            await svc.wait_serving(True)
            # The first calls may still meet the breaker (or a stale connection);
            # within a few of its open periods the service must answer again.
            async with asyncio.timeout(10):
                while True:
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        resp = await svc.call(request("out", [("client", "a")]))
                        if resp.overall_code == OK:
                            break
                    await asyncio.sleep(0.05)
    finally:
        server.close()


async def wait_metric(name: str, value: float, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while metric_value(name, "") != value:
            await asyncio.sleep(0.05)


@pytest.mark.parametrize(("mode", "code"), [("allow", OK), ("deny", OVER)])
async def test_failure_modes_answer_instead_of_erroring(
    config: Path, private_redis: RedisServer, mode: FailureMode, code: int
) -> None:
    """allow/deny answer by policy, with the limits' static facts
    (current_limit, duration_until_reset; T0 is 10 s into the minute), and
    the worker stays ready: it can answer, so it must not leave the
    endpoints (that would hand the decision to Envoy's failure_mode_deny);
    the gauge says that Redis is down instead."""
    async with serve_app(config, redis_url=private_redis.url, settings=settings(mode)) as svc:
        assert (await svc.call(request("out", [("client", "a")]))).overall_code == OK
        await wait_metric("meshplane_ratelimit_redis_unreachable", 0)
        private_redis.kill()
        label = f'result="failure_{mode}"'
        before = metric_value("meshplane_ratelimit_decisions_total", label)
        for _ in range(5):
            resp = await svc.call(request("out", [("client", "a")], [("nolimit", "x")]))
            assert resp.overall_code == code
        assert metric_value("meshplane_ratelimit_decisions_total", label) == before + 5
        limited, free = resp.statuses
        assert limited.code == code and free.code == OK
        assert (limited.current_limit.requests_per_unit, limited.current_limit.unit) == (
            1000,
            MINUTE,
        )
        assert limited.duration_until_reset.seconds == 50
        assert not free.HasField("current_limit")
        if mode == "deny":
            assert headers_of(resp) == {"x-proxy-ratelimited": "true"}
        else:
            assert headers_of(resp) == {}
        # A request with no limited descriptor never needs Redis.
        free_only = await svc.call(request("out", [("nolimit", "x")]))
        assert free_only.overall_code == OK
        # Redis is down, and said so, but the worker stays ready throughout.
        await wait_metric("meshplane_ratelimit_redis_unreachable", 1)
        for _ in range(5):
            assert await svc.serving_status() == health_pb2.HealthCheckResponse.SERVING
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("mode", ["unavailable", "allow", "deny"])
async def test_shadow_only_requests_are_never_denied_without_redis(
    config: Path, private_redis: RedisServer, mode: FailureMode
) -> None:
    """Shadow rules never deny: a request that only hits shadow rules is
    answered OK whatever the failure mode (UNAVAILABLE would let Envoy's
    failure_mode_deny deny it); with a real limit beside it, the mode decides
    for that limit only."""
    async with serve_app(config, redis_url=private_redis.url, settings=settings(mode)) as svc:
        private_redis.kill()
        allowed = metric_value("meshplane_ratelimit_decisions_total", 'result="failure_allow"')
        resp = await svc.call(request("out", [("shadow", "s")]))
        assert resp.overall_code == OK
        assert headers_of(resp) == {}
        (status,) = resp.statuses
        assert status.code == OK
        assert (
            status.current_limit.requests_per_unit,
            status.current_limit.unit,
            status.current_limit.name,
        ) == (5, HOUR, "shadowed")
        assert status.duration_until_reset.seconds == 3590
        assert (
            metric_value("meshplane_ratelimit_decisions_total", 'result="failure_allow"')
            == allowed + 1
        )
        both = request("out", [("shadow", "s")], [("client", "c")])
        if mode == "unavailable":
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await svc.call(both)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        else:
            mixed = await svc.call(both)
            code = OVER if mode == "deny" else OK
            assert mixed.overall_code == code
            assert [s.code for s in mixed.statuses] == [OK, code]


async def test_with_a_failure_policy_a_worker_is_ready_before_redis_is(config: Path) -> None:
    """failureMode allow: no Redis at startup, yet SERVING from the start."""
    server = RedisServer(free_port())
    try:
        async with serve_app(
            config, redis_url=server.url, settings=settings("allow"), wait_ready=False
        ) as svc:
            await svc.wait_serving(True, timeout=2)
            resp = await svc.call(request("out", [("client", "a")]))
            assert resp.overall_code == OK
            await wait_metric("meshplane_ratelimit_redis_unreachable", 1)
            server.start()
            await wait_metric("meshplane_ratelimit_redis_unreachable", 0, timeout=10)
            assert await svc.serving_status() == health_pb2.HealthCheckResponse.SERVING
    finally:
        server.close()
