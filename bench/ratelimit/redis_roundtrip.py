"""The floor under a decision on Redis: the CPU one asyncio round trip costs.

    uv run python bench/ratelimit/redis_roundtrip.py [--count 20000] [--rounds 3]

The rate-limit bench compares our service with a no-op RLS on the same gRPC
runtime. Whatever a decision on Redis adds must fit in the ratio's budget, and
one round trip to Redis is the part no Python change removes: a ``write`` on a
loopback TCP socket (the kernel runs the receiver's TCP path in our context),
an ``epoll`` wake-up, a ``recv`` and a future resolved on the event loop. This
script measures exactly that on this machine, against a redis-server it starts
itself, with a bare ``await`` of a resolved future as the reference, and
prints the process CPU and wall time per operation (median of the rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.ratelimit.noop_rls import RedisGet  # noqa: E402
from tests.support.redis_server import redis_server  # noqa: E402


async def _measure(port: int, count: int, redis: bool) -> tuple[float, float]:
    """(CPU µs, wall µs) per operation."""
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_connection(RedisGet, "127.0.0.1", port)
    try:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(count):
            if redis:
                await protocol.get()
            else:
                future: asyncio.Future[None] = loop.create_future()
                loop.call_soon(future.set_result, None)
                await future
        cpu1, wall1 = time.process_time(), time.perf_counter()
    finally:
        transport.close()
    return (cpu1 - cpu0) / count * 1e6, (wall1 - wall0) / count * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with redis_server() as server:
        results: dict[str, list[tuple[float, float]]] = {"await only": [], "Redis GET": []}
        for _ in range(args.rounds):  # interleaved, so both see the same machine
            results["await only"].append(asyncio.run(_measure(server.port, args.count, False)))
            results["Redis GET"].append(asyncio.run(_measure(server.port, args.count, True)))
    print(f"{'case':<12} {'CPU µs/op':>10} {'wall µs/op':>11}")
    for case, samples in results.items():
        cpu = statistics.median(s[0] for s in samples)
        wall = statistics.median(s[1] for s in samples)
        print(f"{case:<12} {cpu:>10.1f} {wall:>11.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
