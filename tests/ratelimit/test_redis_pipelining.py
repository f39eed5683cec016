"""When a Redis connection holds a write back for company, and how deadlines expire.

Against a real redis-server. Writes are counted through the connection's
``on_flush`` hook (one call per write, i.e. per round trip). Windows are
made long (tens of milliseconds to seconds) so that "held" and "written at
once" differ by far more than the machine's scheduling noise.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from ratelimit.redis_url import parse_redis_url
from ratelimit.store.resp import NodeClient, Pipelining, pack
from tests.support.redis_server import RedisServer


class Writes:
    """Counts the writes (round trips) of a connection."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


@contextlib.asynccontextmanager
async def node(
    redis: RedisServer, pipelining: Pipelining, writes: Writes
) -> AsyncIterator[NodeClient]:
    client = NodeClient(
        ("127.0.0.1", redis.port),
        target=parse_redis_url(redis.url),
        ssl_ctx=None,
        connect_timeout=1.0,
        on_flush=writes,
        pipelining=pipelining,
    )
    try:
        await client.execute(["PING"])  # connected; its writes are not the test's
        yield client
    finally:
        await client.close()


async def incr(client: NodeClient, key: str) -> int:
    reply = await client.execute_one(pack(["INCR", key]), asyncio.get_running_loop().time() + 30)
    assert isinstance(reply, int)
    return reply


async def test_sparse_calls_are_written_at_once(redis: RedisServer) -> None:
    """Calls further apart than the window never wait for company."""
    writes = Writes()
    async with node(redis, Pipelining(window=0.5), writes) as client:
        for i in range(5):
            started = time.monotonic()
            assert await incr(client, "sparse") == i + 1
            assert time.monotonic() - started < 0.25
            await asyncio.sleep(0.6)


async def test_concurrent_calls_share_held_writes(redis: RedisServer) -> None:
    """Bursts of concurrent calls, arriving faster than the window, go out
    together: far fewer writes than calls."""
    writes = Writes()
    async with node(redis, Pipelining(window=0.02), writes) as client:
        before = writes.count
        for _ in range(10):
            # Calls arriving one per loop turn, as a gRPC server hands them in.
            tasks = []
            for _ in range(20):
                tasks.append(asyncio.ensure_future(incr(client, "burst")))
                await asyncio.sleep(0)
            await asyncio.gather(*tasks)
        calls, written = 200, writes.count - before
        assert await incr(client, "burst") == calls + 1
    assert written <= calls / 4, written


async def test_a_caller_alone_stops_being_held(redis: RedisServer) -> None:
    """One call at a time, however fast, has nobody to wait for: once held
    writes are seen to carry one command, only an occasional probe is held."""
    writes = Writes()
    window = 0.05
    async with node(redis, Pipelining(window=window), writes) as client:
        started = time.monotonic()
        for _ in range(200):
            await incr(client, "alone")
        elapsed = time.monotonic() - started
    # Held every time, this would take 200 windows (10 s).
    assert elapsed < 200 * window / 4, elapsed


async def test_the_limit_writes_a_full_queue_at_once(redis: RedisServer) -> None:
    """With a pipeline limit, a held queue goes out as soon as it is full,
    long before the window ends."""
    writes = Writes()
    async with node(redis, Pipelining(window=10.0, limit=5), writes) as client:
        before = writes.count
        started = time.monotonic()
        tasks = []
        for _ in range(5):
            tasks.append(asyncio.ensure_future(incr(client, "full")))
            await asyncio.sleep(0)
        assert sorted(await asyncio.gather(*tasks)) == [1, 2, 3, 4, 5]
        assert time.monotonic() - started < 2.0
        assert writes.count - before == 1


async def test_each_call_expires_at_its_own_deadline(private_redis: RedisServer) -> None:
    """One timer serves a connection's deadlines: a later call with an earlier
    deadline (a decision behind a readiness PING) still expires on time, and
    the earlier call with the later deadline waits for its own."""
    writes = Writes()
    async with node(private_redis, Pipelining(), writes) as client:
        loop = asyncio.get_running_loop()
        with private_redis.paused():
            started = loop.time()

            async def call(key: str, wait: float) -> float:
                with pytest.raises(TimeoutError):
                    await client.execute_one(pack(["INCR", key]), started + wait)
                return loop.time() - started

            long_wait = asyncio.ensure_future(call("long", 1.0))
            short_wait = asyncio.ensure_future(call("short", 0.1))
            short_took = await short_wait
            assert not long_wait.done()
            long_took = await long_wait
    assert 0.1 <= short_took < 0.5, short_took
    assert 1.0 <= long_took < 1.5, long_took
