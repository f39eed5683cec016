"""ratelimit.quota.usage.RedisUsage against a real redis-server: the shared demand view.

What every gateway reported for a bucket comes back from one script call,
sent by EVALSHA (the text crosses again only after NOSCRIPT); a Redis that
answers with an error is a store failure, never an empty view.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from ratelimit.quota.allocation import Usage
from ratelimit.quota.usage import RedisUsage
from ratelimit.redis_url import parse_redis_url
from ratelimit.store import StoreUnavailable
from ratelimit.store.resp import build_keyed_client
from tests.support.redis_server import RedisServer, redis_server

STALE_AFTER = 10.0


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with redis_server() as started:
        yield started


@pytest.fixture
async def usage(server: RedisServer) -> AsyncIterator[RedisUsage]:
    server.command("FLUSHALL")
    server.command("SCRIPT", "FLUSH")
    server.command("CONFIG", "RESETSTAT")
    store = RedisUsage(build_keyed_client(parse_redis_url(server.url)), timeout=5)
    try:
        yield store
    finally:
        await store.close()


def _calls(server: RedisServer, command: str) -> int:
    """How many times Redis ran ``command`` since the fixture reset its statistics."""
    for line in server.command("INFO", "commandstats").splitlines():
        if line.startswith(f"cmdstat_{command}:"):
            return int(line.split("calls=", 1)[1].split(",", 1)[0])
    return 0


async def test_each_report_returns_every_live_member_and_drops_stale_ones(
    usage: RedisUsage,
) -> None:
    await usage.record("b", "gw-old", Usage(5.0, 100.0), STALE_AFTER)
    view = await usage.record("b", "gw-a", Usage(2.0, 105.0), STALE_AFTER)
    assert view == {"gw-old": Usage(5.0, 100.0), "gw-a": Usage(2.0, 105.0)}
    view = await usage.record("b", "gw-b", Usage(1.5, 112.0), STALE_AFTER)
    assert view == {"gw-a": Usage(2.0, 105.0), "gw-b": Usage(1.5, 112.0)}
    await usage.forget("b", "gw-a")
    assert await usage.record("b", "gw-b", Usage(1.0, 113.0), STALE_AFTER) == {
        "gw-b": Usage(1.0, 113.0)
    }


async def test_the_script_text_is_sent_once_per_script_cache(
    usage: RedisUsage, server: RedisServer
) -> None:
    for i in range(5):
        await usage.record("b", "gw-a", Usage(1.0, 100.0 + i), STALE_AFTER)
    assert (_calls(server, "evalsha"), _calls(server, "eval")) == (5, 1)
    server.command("SCRIPT", "FLUSH")  # as after a restart or a failover
    assert await usage.record("b", "gw-a", Usage(1.0, 200.0), STALE_AFTER) == {
        "gw-a": Usage(1.0, 200.0)
    }
    assert (_calls(server, "evalsha"), _calls(server, "eval")) == (6, 2)


async def test_an_error_reply_is_a_store_failure_not_an_empty_view(
    usage: RedisUsage, server: RedisServer
) -> None:
    server.command("SET", RedisUsage.key("b"), "not a hash")
    with pytest.raises(StoreUnavailable) as failure:
        await usage.record("b", "gw-a", Usage(1.0, 100.0), STALE_AFTER)
    assert failure.value.reason == "redis_error"
    assert "WRONGTYPE" in str(failure.value)
