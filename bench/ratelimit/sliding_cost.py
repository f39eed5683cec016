"""What a sliding window costs per decision against a fixed window, same run.

    uv run python bench/ratelimit/sliding_cost.py [--count 20000] [--rounds 3]

The sliding window (docs/ratelimit.md, "Algorithms") reads one more counter
(the previous window's) and weighs it: in Python, one more float expression
per bucket; in Redis, one more GET in the script. The target (issue 26) is at
most 1.3x the CPU of a fixed window per call. This runs the real service
(``RateLimitService`` over the store stack ``build_store`` makes) in a
sequential loop, once with a fixed-window rule and once with the same rule
sliding, in turn within each round (which goes first alternates):

- in memory: the process CPU per decision;
- on a real redis-server this script starts: the process CPU per decision,
  and the redis-server's CPU per decision (from /proc), then their sum.

Figures are CPU µs per decision, the median of the rounds, and the ratio
sliding / fixed per line. One descriptor per request, a limit never reached,
so every call runs the whole path (the local cache never answers).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from envoy.service.ratelimit.v3 import rls_pb2

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ratelimit.app import build_store  # noqa: E402
from ratelimit.config import load_config  # noqa: E402
from ratelimit.service import RateLimitService  # noqa: E402
from ratelimit.settings import Settings  # noqa: E402
from tests.support.redis_server import redis_server  # noqa: E402

_CONFIG = """\
domain: bench
descriptors:
  - key: fixed_window
    rate_limit: {unit: hour, requests_per_unit: 4000000000}
  - key: sliding_window
    rate_limit: {unit: hour, requests_per_unit: 4000000000, algorithm: sliding_window}
"""
_TICKS = os.sysconf("SC_CLK_TCK")
ALGORITHMS = ("fixed_window", "sliding_window")


def _cpu_of(pid: int) -> float:
    """A process's user + system CPU seconds, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


async def _per_call(
    call: Callable[[], Awaitable[object]], count: int, redis_pid: int | None
) -> tuple[float, float]:
    """(our CPU µs, redis-server CPU µs) per call."""
    for _ in range(500):  # warm the plan cache, the connection, the allocator
        await call()
    redis0 = _cpu_of(redis_pid) if redis_pid else 0.0
    start = time.process_time()
    for _ in range(count):
        await call()
    ours = (time.process_time() - start) / count * 1e6
    theirs = (_cpu_of(redis_pid) - redis0) / count * 1e6 if redis_pid else 0.0
    return ours, theirs


async def _round(count: int, redis_url: str, redis_pid: int, flip: bool) -> dict[str, float]:
    directory = Path(tempfile.mkdtemp(prefix="rl-sliding-cost-"))
    (directory / "bench.yaml").write_text(_CONFIG)
    config = load_config(directory)
    settings = Settings(store_timeout=1.0)  # a loaded machine can hold a call past 10 ms
    results: dict[str, float] = {}
    for store_name, url, pid in (("memory", None, None), ("redis", redis_url, redis_pid)):
        # Which goes first alternates between rounds, so drift in the
        # machine's load does not favour one.
        for algorithm in ALGORITHMS[::-1] if flip else ALGORITHMS:
            request = rls_pb2.RateLimitRequest(domain="bench")
            request.descriptors.add().entries.add(key=algorithm, value="c1")
            raw = request.SerializeToString()
            store, _ = build_store(settings, url)
            service = RateLimitService(lambda: config, store, settings)
            ours, theirs = await _per_call(lambda s=service, r=raw: s.decide(r), count, pid)  # type: ignore[misc]
            await service.close()
            results[f"{store_name} {algorithm}: service"] = ours
            if pid:
                results[f"{store_name} {algorithm}: redis-server"] = theirs
                results[f"{store_name} {algorithm}: both"] = ours + theirs
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with redis_server() as server:
        rounds = [
            asyncio.run(_round(args.count, server.url, server.pid, flip=i % 2 == 1))
            for i in range(args.rounds)
        ]
    median = {name: statistics.median(r[name] for r in rounds) for name in rounds[0]}
    print(f"load average: {os.getloadavg()[0]:.2f}")
    print(f"{'case':<40} {'CPU µs/decision':>16} {'sliding/fixed':>14}")
    for name, value in sorted(median.items()):
        ratio = ""
        if "sliding_window" in name:
            ratio = f"{value / median[name.replace('sliding_window', 'fixed_window')]:.2f}x"
        print(f"{name:<40} {value:>16.1f} {ratio:>14}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
