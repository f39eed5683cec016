"""Memory of one worker under requests that are all different (issue 22, item 3).

    uv run python bench/ratelimit/plan_cache_memory.py direct [--count 1000000]
    uv run python bench/ratelimit/plan_cache_memory.py grpc --server envoy [--count 200000]

Every request is what the example gateway (deploy/envoy/ratelimit-gateway.yaml)
sends for its checkout route, with a distinct 64-byte ``x-user-id``: three
descriptors (route; route + user; route + user + client address) against
deploy/ratelimit/config, so each request is a new plan-cache entry, three new
buckets and a new response template. Counters live in a real redis-server
(several workers need one), so what grows is the worker's own memory.

* ``direct``: the decision path in this process (``RateLimitService.decide``
  over the store stack ``build_store`` makes, on Redis), ``--concurrency``
  calls in flight; prints this process's RSS. A million gRPC calls from a
  Python client would take too long on a shared machine, hence this mode.
* ``grpc``: ``ratelimit serve --workers 1`` (Envoy-based server or h2)
  called over gRPC; prints the worker's RSS.

RSS is printed after a warm-up of 20,000 requests and then every
``--every`` requests; ``--bound-mb`` makes the exit code 1 when the last
figure is above it. With ``--calibrate``, also the bytes tracemalloc sees per
cached plan, next to the plan cache's own estimate.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import hashlib
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import grpc
from envoy.service.ratelimit.v3 import rls_pb2

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from meshplane.server_contract import SERVER_KINDS  # noqa: E402
from ratelimit import plan as plan_module  # noqa: E402
from ratelimit.app import build_store  # noqa: E402
from ratelimit.config import load_config  # noqa: E402
from ratelimit.service import RateLimitService  # noqa: E402
from ratelimit.settings import Settings  # noqa: E402
from ratelimit.store import StoreUnavailable  # noqa: E402
from tests.support.net import free_port, wait_for_port  # noqa: E402
from tests.support.redis_server import redis_server  # noqa: E402

CONFIG = ROOT / "deploy/ratelimit/config"
METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
WARMUP = 20_000


def gateway_request(i: int) -> bytes:
    """The checkout route's request with user number ``i`` (64 bytes, distinct)."""
    user = hashlib.sha256(b"%d" % i).hexdigest()  # 64 characters
    address = f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"
    request = rls_pb2.RateLimitRequest(domain="edge-gateway")
    route = ("route", "checkout")
    by_user = [route, ("user", user)]
    for entries in ([route], by_user, [*by_user, ("remote_address", address)]):
        descriptor = request.descriptors.add()
        for key, value in entries:
            descriptor.entries.add(key=key, value=value)
    return bytes(request.SerializeToString())


def rss_mb(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def drive(
    call: Callable[[bytes], Awaitable[object]],
    count: int,
    concurrency: int,
    every: int,
    rss: Callable[[], float],
) -> float:
    """``count`` distinct requests, ``concurrency`` in flight; prints RSS as it goes."""
    next_index = 0
    done = 0
    failed = 0
    started = time.monotonic()

    async def worker() -> None:
        nonlocal next_index, done, failed
        while next_index < count:
            i = next_index
            next_index += 1
            try:
                await call(gateway_request(i))
            except (StoreUnavailable, grpc.aio.AioRpcError):
                failed += 1  # counted, not fatal: memory is what is measured
            done += 1
            if done == WARMUP or done % every == 0:
                rate = done / (time.monotonic() - started)
                print(
                    f"{done:>9} requests  RSS {rss():7.1f} MB  ({rate:,.0f}/s, {failed} failed)",
                    flush=True,
                )

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return rss()


async def direct(args: argparse.Namespace, redis_url: str) -> float:
    settings = Settings(store_timeout=5.0)  # a loaded machine must not turn calls into errors
    config = load_config(CONFIG)
    store, _ = build_store(settings, redis_url)
    service = RateLimitService(lambda: config, store, settings)
    print(f"before the first request: RSS {rss_mb():.1f} MB", flush=True)
    try:
        if args.calibrate:
            await calibrate(service)
        return await drive(service.decide, args.count, args.concurrency, args.every, rss_mb)
    finally:
        await service.close()


async def calibrate(service: RateLimitService) -> None:
    """What a cached plan really holds (with its memo) vs. the cache's estimate:
    the traced memory that clearing the cache gives back, per entry."""
    tracemalloc.start()
    for i in range(10_000_000, 10_005_000):
        await service.decide(gateway_request(i))
    cache = plan_module._plan_cache
    entries, estimate = len(cache.plans), cache.size
    held = tracemalloc.get_traced_memory()[0]
    cache.plans.clear()
    cache.size = 0
    gc.collect()
    freed = held - tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    print(
        f"calibration: a cached plan holds {freed / entries:,.0f} bytes (traced),"
        f" counted as {estimate / entries:,.0f}",
        flush=True,
    )


@contextlib.contextmanager
def serving(server: str, redis_url: str) -> Iterator[tuple[int, int]]:
    """``ratelimit serve`` with one worker; yields (port, worker pid)."""
    port = free_port()
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "ratelimit"), "serve", "--config", str(CONFIG),
         "--listen", f"127.0.0.1:{port}", "--workers", "1", "--server", server,
         "--redis-url", redis_url, "--store-timeout-ms", "5000"],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for_port(port, timeout=60)
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        yield port, max(map(int, children), key=rss_mb)  # spawned workers have a helper too
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def over_grpc(args: argparse.Namespace, redis_url: str) -> float:
    with serving(args.server, redis_url) as (port, worker):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            method: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(METHOD)
            deadline = time.monotonic() + 60
            while True:  # until ready (the worker's first PING of Redis)
                try:
                    await method(gateway_request(-1), timeout=5)
                    break
                except grpc.aio.AioRpcError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)
            print(f"worker {worker} ready: RSS {rss_mb(worker):.1f} MB", flush=True)

            async def call(raw: bytes) -> object:
                return await method(raw, timeout=30)

            return await drive(
                call, args.count, args.concurrency, args.every, lambda: rss_mb(worker)
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["direct", "grpc"])
    parser.add_argument("--server", choices=SERVER_KINDS, default=SERVER_KINDS[0])
    parser.add_argument("--count", type=int)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--every", type=int, default=100_000)
    parser.add_argument("--bound-mb", type=float)
    parser.add_argument("--calibrate", action="store_true")
    args = parser.parse_args()
    args.count = args.count or (1_000_000 if args.mode == "direct" else 200_000)
    with redis_server() as redis:
        run = direct if args.mode == "direct" else over_grpc
        last = asyncio.run(run(args, redis.url))
    print(f"after {args.count:,} distinct requests: RSS {last:.1f} MB")
    if args.bound_mb is not None and last > args.bound_mb:
        print(f"above the bound of {args.bound_mb:g} MB")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
