"""What one decision costs in Python alone, with the kernel taken out.

    uv run python bench/ratelimit/python_cost.py [--count 50000] [--rounds 2]

On loopback, a decision on Redis is dominated by socket and wake-up work
that moves by ±30% with the machine's load, which hides changes of a few
microseconds in our own code. This bench runs the real service
(``RateLimitService`` over the store stack ``build_store`` makes) in a tight
loop, once in memory and once on Redis, where the Redis connection's
transport is replaced by one that answers each EVALSHA on the next event
loop turn with a canned reply. Everything of ours runs (planning, the local
cache, the breaker, packing, the RESP protocol, hiredis, response building,
metrics); only the kernel does not. A bare "await a future resolved on the
next turn" is printed as the floor of any suspension.

Figures are process CPU µs per decision (median of the rounds). They are a
lower bound of the real cost: on a real socket the same Python runs with
colder caches after every syscall (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

from envoy.service.ratelimit.v3 import rls_pb2

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.fake_redis import fake_connection  # noqa: E402
from ratelimit.app import build_store  # noqa: E402
from ratelimit.config import load_config  # noqa: E402
from ratelimit.service import RateLimitService  # noqa: E402
from ratelimit.settings import Settings  # noqa: E402

_CONFIG = """\
domain: bench
descriptors:
  - key: client
    rate_limit: {unit: hour, requests_per_unit: 4000000000}
"""
# The script's answer for one bucket: allowed, counter before.
_EVALSHA_REPLY = b"*2\r\n:1\r\n:5\r\n"


class _NextTurnRedis(asyncio.Transport):
    """Answers every command written to it on the next loop turn (PING: PONG)."""

    def __init__(self, protocol: asyncio.Protocol) -> None:
        super().__init__()
        self._protocol = protocol
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        data = bytes(data)
        reply = data.count(b"PING") * b"+PONG\r\n" + data.count(b"EVALSHA") * _EVALSHA_REPLY
        self._loop.call_soon(self._protocol.data_received, reply)

    def close(self) -> None:
        return None

    def is_closing(self) -> bool:
        return False


async def _per_call(call: Callable[[], Awaitable[object]], count: int) -> float:
    for _ in range(500):  # warm the plan cache, the connection, the allocator
        await call()
    start = time.process_time()
    for _ in range(count):
        await call()
    return (time.process_time() - start) / count * 1e6


async def _round(count: int) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    # Only this loop's connections are faked: the store stack is the real one.
    loop.create_connection = fake_connection(_NextTurnRedis)  # type: ignore[method-assign]  # a fake Redis, for this loop only
    directory = Path(tempfile.mkdtemp(prefix="rl-python-cost-"))
    (directory / "bench.yaml").write_text(_CONFIG)
    config = load_config(directory)
    request = rls_pb2.RateLimitRequest(domain="bench")
    request.descriptors.add().entries.add(key="client", value="c1")
    raw_request = request.SerializeToString()
    results: dict[str, float] = {}
    # A loaded machine can hold a call past the default 10 ms, which would
    # end the run with UNAVAILABLE; the timeout costs nothing per call.
    base = Settings(store_timeout=1.0)
    cases = {
        "in-memory": (base, None),
        # The reference's RESPONSE_DYNAMIC_METADATA: the request is read again
        # and the Struct encoded on every answer (docs/ratelimit.md).
        "in-memory, responseDynamicMetadata on": (replace(base, dynamic_metadata=True), None),
        "Redis (fake transport), local cache on": (base, "redis://127.0.0.1:6379/0"),
        "Redis (fake transport), pipelining off": (
            replace(base, redis_pipeline_window=0.0),
            "redis://127.0.0.1:6379/0",
        ),
        "Redis (fake transport), local cache off": (
            replace(base, local_cache_size=0),
            "redis://127.0.0.1:6379/0",
        ),
    }
    for name, (settings, url) in cases.items():
        store, _ = build_store(settings, url)
        service = RateLimitService(lambda: config, store, settings)
        results[name] = await _per_call(lambda s=service: s.decide(raw_request), count)  # type: ignore[misc]
        await service.close()

    async def next_turn() -> None:
        future: asyncio.Future[None] = loop.create_future()
        loop.call_soon(future.set_result, None)
        await future

    results["bare await of the next loop turn"] = await _per_call(next_turn, count)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=50000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    rounds = [asyncio.run(_round(args.count)) for _ in range(args.rounds)]
    print(f"{'case':<42} {'CPU µs/decision':>16}")
    for name in rounds[0]:
        print(f"{name:<42} {statistics.median(r[name] for r in rounds):>16.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
