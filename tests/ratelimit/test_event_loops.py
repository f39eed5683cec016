"""The Redis store on both event loops a worker may run: asyncio and uvloop.

The in-process test servers run the service on asyncio; both backends' workers
run it on uvloop, whose transports are not ``asyncio.Transport`` subclasses. The
same decisions (count, deny, refill-free second window) must come out on each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
import uvloop
from envoy.service.ratelimit.v3 import rls_pb2

from ratelimit.app import build_store
from ratelimit.config import load_config
from ratelimit.service import RateLimitService
from ratelimit.settings import Settings
from tests.ratelimit.conftest import OK, OVER, T0, request, write_config
from tests.support.redis_server import RedisServer

CONFIG = """\
domain: loops
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
"""

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


@pytest.mark.parametrize("loop_name", sorted(LOOPS))
def test_redis_decisions_on_each_event_loop(
    loop_name: str, redis: RedisServer, tmp_path: Path
) -> None:
    config = load_config(write_config(tmp_path, "loops.yaml", CONFIG))

    async def decisions() -> list[int]:
        store, redis_store = build_store(Settings(store_timeout=5.0), redis.url)
        assert redis_store is not None
        service = RateLimitService(lambda: config, store, Settings(), clock=lambda: T0)
        try:
            raw = request("loops", [("user", loop_name)]).SerializeToString()
            codes = []
            for _ in range(3):
                answer = rls_pb2.RateLimitResponse.FromString(await service.decide(raw))
                codes.append(answer.overall_code)
            return codes
        finally:
            await service.close()

    with asyncio.Runner(loop_factory=LOOPS[loop_name]) as runner:
        assert runner.run(decisions()) == [OK, OK, OVER]
