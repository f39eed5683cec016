"""Redis going away: bounded waits, the breaker, failure modes, readiness, and
recovery when a redis-server is killed and restarted mid-run."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from pathlib import Path

import grpc
import pytest

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
from tests.support.redis_server import RedisServer

CONFIG = """\
domain: out
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 1000}
"""


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


async def test_redis_killed_and_restarted_mid_run(config: Path) -> None:
    server = RedisServer().start()
    try:
        async with serve_app(config, redis_url=server.url, settings=settings()) as svc:
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
            await asyncio.sleep(0.3)
            assert results["ok"] > 0
            breaker_before = metric_value(
                "meshplane_ratelimit_store_errors_total", 'reason="breaker_open"'
            )
            server.kill()
            await svc.wait_serving(False)
            unavailable_before = results["UNAVAILABLE"]
            await asyncio.sleep(0.5)
            assert results["UNAVAILABLE"] > unavailable_before
            # While Redis is down most calls are refused by the open breaker, not by a wait.
            assert (
                metric_value("meshplane_ratelimit_store_errors_total", 'reason="breaker_open"')
                > breaker_before
            )
            server.start()  # same port, empty, and without our script loaded
            await svc.wait_serving(True)
            ok_before = results["ok"]
            await asyncio.sleep(0.5)
            stop.set()
            await task
            assert results["ok"] > ok_before
            assert set(results) <= {"ok", "UNAVAILABLE"}
    finally:
        server.close()


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


@pytest.mark.parametrize(("mode", "code"), [("allow", OK), ("deny", OVER)])
async def test_failure_modes_answer_instead_of_erroring(
    config: Path, mode: FailureMode, code: int
) -> None:
    server = RedisServer().start()
    try:
        async with serve_app(config, redis_url=server.url, settings=settings(mode)) as svc:
            assert (await svc.call(request("out", [("client", "a")]))).overall_code == OK
            server.kill()
            label = f'result="failure_{mode}"'
            before = metric_value("meshplane_ratelimit_decisions_total", label)
            for _ in range(5):
                resp = await svc.call(request("out", [("client", "a")], [("nolimit", "x")]))
                assert resp.overall_code == code
            assert metric_value("meshplane_ratelimit_decisions_total", label) == before + 5
            if mode == "deny":
                assert headers_of(resp) == {"x-proxy-ratelimited": "true"}
            else:
                assert headers_of(resp) == {}
            # A request with no limited descriptor never needs Redis.
            free = await svc.call(request("out", [("nolimit", "x")]))
            assert free.overall_code == OK
    finally:
        server.close()
