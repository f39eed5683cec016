"""Where every gateway's demand for a bucket is kept: Redis, or this process's memory.

One record per (bucket, gateway stream): its smoothed demand and when it was
reported. Each report writes its own record and reads them all in one step,
so every instance allocates from the same global view. Records older than
``stale_after`` are dropped on the way, and a bucket nobody reports expires.

Without Redis (no URL, as for the fixed windows) the view is this process's:
right for one instance, and what a Redis outage falls back to (the gateways
this instance serves, with the shares they already hold).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from typing import Protocol

import hiredis

from ratelimit.quota.allocation import Usage
from ratelimit.store import StoreUnavailable
from ratelimit.store.resp import (
    KeyedClient,
    RedisConnectionError,
    RedisReplyError,
    pack,
    script_missing,
)

_KEY_PREFIX = "rlqs"

# KEYS[1]: the bucket's hash. ARGV: member, "demand at", stale_before, ttl_ms.
# Returns the live members flattened: member, "demand at", ...
_SCRIPT = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local all = redis.call('HGETALL', KEYS[1])
local out = {}
local stale = tonumber(ARGV[3])
for i = 1, #all, 2 do
  local at = tonumber(string.match(all[i + 1], ' (%S+)$'))
  if at == nil or at < stale then
    redis.call('HDEL', KEYS[1], all[i])
  else
    out[#out + 1] = all[i]
    out[#out + 1] = all[i + 1]
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return out
"""
_SHA = hashlib.sha1(_SCRIPT.encode(), usedforsecurity=False).hexdigest()


class UsageStore(Protocol):
    """The seam between the quota service and where demand is kept."""

    async def record(
        self, bucket: str, member: str, usage: Usage, stale_after: float
    ) -> dict[str, Usage]:
        """Write ``member``'s usage of ``bucket``; every live member's usage."""

    async def forget(self, bucket: str, member: str) -> None:
        """``member`` no longer reports ``bucket`` (abandoned, or its stream ended)."""

    async def close(self) -> None: ...


class MemoryUsage:
    """This process's view (no Redis, or Redis unreachable)."""

    def __init__(self) -> None:
        self._buckets: dict[str, dict[str, Usage]] = {}

    async def record(
        self, bucket: str, member: str, usage: Usage, stale_after: float
    ) -> dict[str, Usage]:
        return self.record_now(bucket, member, usage, stale_after)

    def record_now(
        self, bucket: str, member: str, usage: Usage, stale_after: float
    ) -> dict[str, Usage]:
        members = self._buckets.setdefault(bucket, {})
        members[member] = usage
        for name in [n for n, u in members.items() if usage.at - u.at > stale_after]:
            del members[name]
        return dict(members)

    async def forget(self, bucket: str, member: str) -> None:
        members = self._buckets.get(bucket)
        if members is not None:
            members.pop(member, None)
            if not members:
                del self._buckets[bucket]

    async def close(self) -> None:
        self._buckets.clear()


class RedisUsage:
    """Every instance's view: one hash per bucket, one script call per report.

    The call is an EVALSHA (the script's text crosses once per Redis start, by
    EVAL after NOSCRIPT). An error reply is the store failing, like a lost
    connection: the caller allocates from its own view, never from an empty one.
    """

    def __init__(self, client: KeyedClient, timeout: float) -> None:
        self._client = client
        self._timeout = timeout

    @staticmethod
    def key(bucket: str) -> str:
        return f"{_KEY_PREFIX}:{{{bucket}}}"

    async def _run(self, key: str, *args: str | int) -> object:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        try:
            async with asyncio.timeout(self._timeout + 0.05):
                reply = await self._client.execute_packed(
                    key, pack(["EVALSHA", _SHA, 1, key, *args]), deadline
                )
                if script_missing(reply):
                    reply = await self._client.execute_packed(
                        key, pack(["EVAL", _SCRIPT, 1, key, *args]), deadline
                    )
        except (RedisConnectionError, RedisReplyError, TimeoutError) as exc:
            raise StoreUnavailable("redis_error", str(exc) or type(exc).__name__) from exc
        if isinstance(reply, hiredis.ReplyError):
            raise StoreUnavailable("redis_error", str(reply).split(" ", 1)[0])
        return reply

    async def record(
        self, bucket: str, member: str, usage: Usage, stale_after: float
    ) -> dict[str, Usage]:
        key = self.key(bucket)
        value = f"{usage.demand:.6f} {usage.at:.3f}"
        ttl_ms = int(stale_after * 2000)
        reply = await self._run(key, member, value, f"{usage.at - stale_after:.3f}", ttl_ms)
        return _parse(reply)

    async def forget(self, bucket: str, member: str) -> None:
        key = self.key(bucket)
        loop = asyncio.get_running_loop()
        # On failure the record goes stale and is dropped anyway.
        with contextlib.suppress(RedisConnectionError, RedisReplyError, TimeoutError):
            await self._client.execute_packed(
                key, pack(["HDEL", key, member]), loop.time() + self._timeout
            )

    async def close(self) -> None:
        await self._client.close()


def _parse(reply: object) -> dict[str, Usage]:
    out: dict[str, Usage] = {}
    if not isinstance(reply, list):
        return out
    for name, value in zip(reply[::2], reply[1::2], strict=True):
        member = name.decode() if isinstance(name, bytes) else str(name)
        text = value.decode() if isinstance(value, bytes) else str(value)
        demand, _, at = text.partition(" ")
        out[member] = Usage(float(demand), float(at))
    return out
