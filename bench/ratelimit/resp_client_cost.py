"""Our RESP client (``ratelimit/store/resp.py``) against redis-py, per EVALSHA.

    uv run --frozen python bench/ratelimit/resp_client_cost.py [--count 20000] [--rounds 3]

The rate-limit hot path sends one EVALSHA per decision. This times exactly
that call through each client, on uvloop (the servers' loop), against a
redis-server the script starts: a two-key script shaped like the decision's
(an INCRBY and a PEXPIRE per key), with packed arguments as the store sends
them. redis-py is ``redis.asyncio.Redis`` with its hiredis parser, the way
its documentation recommends for speed. Two shapes:

* ``sequential``: one call in flight (a lone gateway call);
* ``32 in flight``: 32 tasks calling at once (a busy worker). Ours shares
  one connection and one ``write`` per loop turn between them; redis-py
  takes a pooled connection per call in flight.

Prints this process's CPU µs and wall µs per call (redis-server's own CPU
not included), the median of the rounds, which alternate the clients.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import redis.asyncio
import uvloop

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ratelimit.redis_url import parse_redis_url  # noqa: E402
from ratelimit.store.resp import NodeClient, pack  # noqa: E402
from tests.support.redis_server import redis_server  # noqa: E402

SCRIPT = """
for i, key in ipairs(KEYS) do
  redis.call('INCRBY', key, ARGV[1])
  redis.call('PEXPIRE', key, ARGV[2])
end
return 1
"""
KEYS = ("rl:{domain}:a", "rl:{domain}:b")

Call = Callable[[], Awaitable[object]]


async def _run(call: Call, count: int, in_flight: int) -> tuple[float, float]:
    """(CPU µs, wall µs) per call of ``count`` calls, ``in_flight`` at a time."""

    async def worker(calls: int) -> None:
        for _ in range(calls):
            await call()

    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker(count // in_flight) for _ in range(in_flight)))
    done = (count // in_flight) * in_flight
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return cpu / done * 1e6, wall / done * 1e6


async def _clients(url: str, port: int) -> tuple[dict[str, Call], Callable[[], Awaitable[None]]]:
    py = redis.asyncio.Redis(host="127.0.0.1", port=port, max_connections=64)
    sha = await py.script_load(SCRIPT)
    ours = NodeClient(("127.0.0.1", port), target=parse_redis_url(url), ssl_ctx=None,
                      connect_timeout=1.0)  # fmt: skip
    command = pack(["EVALSHA", sha, len(KEYS), *KEYS, 1, 60000])

    async def call_ours() -> object:
        return await ours.execute_one(command, None)

    async def call_py() -> object:
        return await py.evalsha(sha, len(KEYS), *KEYS, 1, 60000)

    async def close() -> None:
        await ours.close()
        await py.aclose()

    return {"resp.py": call_ours, "redis-py": call_py}, close


async def _main(url: str, port: int, count: int, rounds: int) -> None:
    clients, close = await _clients(url, port)
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    try:
        for name, call in clients.items():  # both answer the script's 1, then warm up
            reply = await call()
            if reply != 1:
                raise SystemExit(f"{name} answered {reply!r}, not the script's 1")
            await _run(call, 1000, 8)
        for number in range(rounds):
            order = list(clients.items())
            if number % 2:
                order.reverse()
            for name, call in order:
                for shape, in_flight in (("sequential", 1), ("32 in flight", 32)):
                    results.setdefault((name, shape), []).append(await _run(call, count, in_flight))
    finally:
        await close()
    print(f"{'client':<10} {'shape':<14} {'CPU µs/call':>12} {'wall µs/call':>13}")
    for (name, shape), runs in sorted(results.items(), key=lambda item: (item[0][1], item[0][0])):
        cpu = statistics.median(r[0] for r in runs)
        wall = statistics.median(r[1] for r in runs)
        print(f"{name:<10} {shape:<14} {cpu:>12.1f} {wall:>13.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20000, help="calls per case and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with redis_server() as server:
        uvloop.run(_main(server.url, server.port, args.count, args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
