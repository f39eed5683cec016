"""Redis counters: one Lua script per decision, concurrent decisions pipelined.

Why a script: the decision over all of a request's buckets must be atomic
(a denied request charges nothing), and a key's TTL must be set in the same
step as its creation so a key can never be left without one (the reference's
separate ``INCRBY`` + ``EXPIRE`` can, behind proxies that reorder them). The
script GETs every key, decides with the same rule as
:func:`ratelimit.store.decide`, and only if the request is allowed INCRBYs the
fitting keys, setting ``PEXPIRE`` to the end of the window on the INCRBY that
created the key. It returns the counters as they were before, and Python
re-derives the outcome with :func:`decide`, so both stores share one rule.

Why it works in Cluster: every key of one request carries the domain's hash
tag (see :mod:`ratelimit.buckets`), so they share a slot and one EVALSHA
covers them.

Pipelining: every decision is one EVALSHA on the node's single shared
connection (:mod:`ratelimit.store.resp`); the calls issued during one event
loop turn leave in one write and their replies are read together, so
concurrent decisions share round trips instead of each waiting for its own.

Redis down: each call waits at most ``timeout`` seconds, then raises
StoreUnavailable; the breaker then fails calls at once until a trial call
succeeds. A call whose caller gave up before it was written is never written
(:mod:`ratelimit.store.resp`), a connection that owes a reply for more than
twice the timeout is dropped, and so is every connection when the breaker
opens: the calls after an outage go out on a fresh connection instead of
queueing behind, and being replayed after, a reply that never came. Only a
call already written when Redis stalled may still charge its buckets late;
that errs towards over-counting, never towards exceeding a limit.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import Callable, Sequence

import hiredis

from ratelimit import metrics
from ratelimit.breaker import CircuitBreaker
from ratelimit.buckets import Bucket
from ratelimit.store import Outcome, StoreUnavailable, decide, weighted
from ratelimit.store.resp import (
    KeyedClient,
    RedisConnectionError,
    RedisReplyError,
    Reply,
    pack,
    script_missing,
)

log = logging.getLogger(__name__)

#: KEYS: the request's distinct bucket keys, then the previous window's key of
#: each sliding-window bucket, in the same order.
#: ARGV: per bucket, 5 values: limit, cost, window end (epoch ms), its mode
#: (0: binding, 1: shadow, 2: quota, which denies only when no quota bucket fits),
#: window length in ms for a sliding window (0: fixed); then the caller's clock
#: (epoch ms). A new key lives until its window's end by the caller's clock (a
#: window later for a sliding window, whose counter is then the previous one),
#: as a TTL relative to now, so a skew between our clock and Redis's cannot
#: stretch or cut a window. A sliding bucket's count is its counter plus the
#: previous counter weighted by the part of the previous window still covered,
#: rounded up, computed as ratelimit.store.weighted does.
#: Returns {allowed, count_before_1, ..., count_before_n, previous_1, ...}.
DECIDE_SCRIPT = """
local n = (#ARGV - 1) / 5
local now = tonumber(ARGV[#ARGV])
local before = {}
local seen = {}
local previous = {}
local allowed = 1
local quota_missed = 0
local quota_fit = 0
local j = n
for i = 1, n do
  local a = (i - 1) * 5
  local c = tonumber(redis.call('GET', KEYS[i]) or '0')
  before[i] = c
  local len = tonumber(ARGV[a + 5])
  if len > 0 then
    j = j + 1
    local p = tonumber(redis.call('GET', KEYS[j]) or '0')
    previous[#previous + 1] = p
    c = c + math.ceil(p * (tonumber(ARGV[a + 3]) - now) / len)
  end
  seen[i] = c
  local need = tonumber(ARGV[a + 2])
  if need < 1 then need = 1 end
  if tonumber(ARGV[a + 1]) - c < need then
    if ARGV[a + 4] == '0' then allowed = 0 elseif ARGV[a + 4] == '2' then quota_missed = 1 end
  elseif ARGV[a + 4] == '2' then
    quota_fit = 1
  end
end
if quota_missed == 1 and quota_fit == 0 then allowed = 0 end
if allowed == 1 then
  for i = 1, n do
    local a = (i - 1) * 5
    local cost = tonumber(ARGV[a + 2])
    local need = cost
    if need < 1 then need = 1 end
    if cost > 0 and tonumber(ARGV[a + 1]) - seen[i] >= need then
      if redis.call('INCRBY', KEYS[i], cost) == cost then
        local ttl = tonumber(ARGV[a + 3]) + tonumber(ARGV[a + 5]) - now
        if ttl < 1 then ttl = 1 end
        redis.call('PEXPIRE', KEYS[i], ttl)
      end
    end
  end
end
table.insert(before, 1, allowed)
for k = 1, #previous do before[#before + 1] = previous[k] end
return before
"""
DECIDE_SHA = hashlib.sha1(DECIDE_SCRIPT.encode(), usedforsecurity=False).hexdigest()


def _script_body(buckets: Sequence[Bucket]) -> bytes:
    """The packed arguments of a script call but the clock (see DECIDE_SCRIPT).

    They depend only on the buckets, which a cached plan reuses for every
    request until its window turns, so :class:`RedisStore` packs them once
    per plan rather than once per call.
    """
    count = b"%d" % _key_count(buckets)
    parts = [b"$%d\r\n%b\r\n" % (len(count), count)]
    append = parts.append
    for key_text in [b.key for b in buckets] + [b.prev_key for b in buckets if b.prev_key]:
        key = key_text.encode()
        append(b"$%d\r\n%b\r\n" % (len(key), key))
    for b in buckets:
        sliding_ms = b.window.seconds * 1000 if b.prev_key else 0
        mode = 1 if b.shadow else 2 if b.quota else 0
        for value in (b.limit, b.cost, b.window.end * 1000, mode, sliding_ms):
            raw = b"%d" % value
            append(b"$%d\r\n%b\r\n" % (len(raw), raw))
    return b"".join(parts)


def _key_count(buckets: Sequence[Bucket]) -> int:
    """The script's KEYS: every bucket's, and the previous one of each sliding bucket."""
    return len(buckets) + sum(1 for b in buckets if b.prev_key)


def _arity(buckets: Sequence[Bucket]) -> int:
    """The packed call's array length: command, sha, numkeys, KEYS, ARGV."""
    return 4 + _key_count(buckets) + 5 * len(buckets)


def _script_call(head: bytes, buckets: Sequence[Bucket], now: float, body: bytes = b"") -> bytes:
    """``pack([*head, n, *keys, *args, now_ms])`` (see DECIDE_SCRIPT), written out for the hot path.

    ``head`` is the packed command name and its first argument without the
    array header: :data:`_EVALSHA_HEAD` on every call, :data:`_EVAL_HEAD`
    after NOSCRIPT. ``body`` is :func:`_script_body` of ``buckets`` if the
    caller has it at hand.
    """
    return b"".join(
        (
            b"*%d\r\n" % _arity(buckets),
            head,
            body or _script_body(buckets),
            _clock_arg(math.floor(now * 1000)),
        )
    )


def _clock_arg(now_ms: int) -> bytes:
    """The script call's last argument: the caller's clock in epoch milliseconds."""
    digits = b"%d" % now_ms
    return b"$%d\r\n%b\r\n" % (len(digits), digits)


#: What a packed call's entry is counted as per bucket it holds on to.
_BUCKET_BYTES = 256

_EVALSHA_HEAD = pack(["EVALSHA", DECIDE_SHA]).partition(b"\r\n")[2]
_EVAL_HEAD = pack(["EVAL", DECIDE_SCRIPT]).partition(b"\r\n")[2]


class RedisStore:
    """The CounterStore on Redis standalone, Sentinel or Cluster."""

    is_global = True
    kind = "redis"

    def __init__(
        self,
        client: KeyedClient,
        *,
        timeout: float = 0.010,
        breaker: CircuitBreaker | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        on_decision: Callable[[], None] | None = None,
        command_cache_bytes: int = 16 << 20,
    ) -> None:
        self._client = client
        self._timeout = timeout
        self._breaker = breaker or CircuitBreaker()
        self._monotonic = monotonic
        self._on_decision = on_decision
        # id(buckets) -> (buckets, the packed EVALSHA but its last argument);
        # holding the buckets keeps the id from being reused while the entry lives.
        # Bounded in bytes, counting the buckets each entry holds on to; the
        # cache starts again when full. A cached plan's buckets are the same
        # tuple all its window long, so a repeated call is packed once per window.
        self._commands: dict[int, tuple[Sequence[Bucket], bytes]] = {}
        self._commands_size = 0
        self._max_command_bytes = command_cache_bytes
        self._loop: asyncio.AbstractEventLoop | None = None
        self._clock_ms = -1  # the last call's clock, and its packed argument
        self._clock = b""
        # A reply owed for twice the call timeout means a stalled server or a
        # dead host, not a slow answer: give the connection up.
        client.set_stall_timeout(2 * timeout)

    @property
    def breaker(self) -> CircuitBreaker:
        return self._breaker

    async def apply(self, buckets: Sequence[Bucket], now: float) -> Outcome:
        breaker = self._breaker
        if not breaker.closed and not breaker.allow(self._monotonic()):
            raise StoreUnavailable("breaker_open")
        loop = self._loop
        if loop is None or not loop.is_running():
            # Kept: asyncio.get_running_loop() costs a getpid system call on 3.11.
            loop = self._loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        try:
            if self._on_decision is not None:
                self._on_decision()
            # The usual call in one coroutine: queued on the live connection,
            # its reply awaited right here (see KeyedClient.send_packed).
            command = self._command(buckets, now)
            future = self._client.send_packed(command, deadline)
            if future is None:
                reply = await self._run(buckets, now, deadline, command)
            else:
                reply = await future
                if isinstance(reply, hiredis.ReplyError):
                    self._client.replied_error(reply)
                    reply = await self._after_error(buckets, now, deadline, reply)
            if not isinstance(reply, list):  # pragma: no cover - not our script's answer
                raise RedisReplyError("unexpected reply")
        except TimeoutError:
            self._failed()
            raise StoreUnavailable(
                "timeout", f"no answer within {self._timeout * 1000:g} ms"
            ) from None
        except (RedisConnectionError, RedisReplyError) as exc:
            self._failed()
            raise StoreUnavailable("redis_error", str(exc)) from exc
        breaker.record_success()
        n = len(buckets)
        # The script's numbers come back as RESP integers: hiredis makes them ints.
        before = reply[1 : n + 1]
        if len(reply) > n + 1:  # sliding windows: weigh the previous counters in
            before = weighted(buckets, before, reply[n + 1 :], now)
        outcome = decide(buckets, before)
        if outcome.allowed != bool(reply[0]):  # pragma: no cover - script and decide() disagree
            raise StoreUnavailable("script_mismatch")
        return outcome

    def _failed(self) -> None:
        if self._breaker.record_failure(self._monotonic()):
            # Calls stop here while the breaker is open; drop the connections
            # too, so that nothing still queued on them is ever written and
            # the trial call reconnects (a Sentinel master is asked anew).
            log.warning("Redis circuit breaker opened; dropping the connections")
            self._client.reset()

    async def _run(
        self, buckets: Sequence[Bucket], now: float, deadline: float, command: bytes
    ) -> Reply:
        """The script call through the client's general path (connecting, Cluster)."""
        reply = await self._client.execute_packed(buckets[0].key, command, deadline)
        if isinstance(reply, hiredis.ReplyError):
            reply = await self._after_error(buckets, now, deadline, reply)
        return reply

    async def _after_error(
        self, buckets: Sequence[Bucket], now: float, deadline: float, reply: hiredis.ReplyError
    ) -> Reply:
        """NOSCRIPT: run the script with EVAL once; any other error is raised."""
        if script_missing(reply):
            reply = await self._client.execute_packed(
                buckets[0].key, _script_call(_EVAL_HEAD, buckets, now), deadline
            )
        if isinstance(reply, hiredis.ReplyError):
            raise RedisReplyError(str(reply).split(" ", 1)[0])
        return reply

    def _command(self, buckets: Sequence[Bucket], now: float) -> bytes:
        """The packed EVALSHA: all but the clock packed once per plan (a cached
        plan hands in the same buckets tuple on every call of its window)."""
        entry = self._commands.get(id(buckets))
        if entry is None or entry[0] is not buckets:
            head = b"*%d\r\n%b%b" % (_arity(buckets), _EVALSHA_HEAD, _script_body(buckets))
            entry = (buckets, head)
            size = len(head) + _BUCKET_BYTES * len(buckets)
            if self._commands_size + size > self._max_command_bytes:
                self._commands.clear()
                self._commands_size = 0
            if size <= self._max_command_bytes // 64:  # a call that big is packed every time
                self._commands[id(buckets)] = entry
                self._commands_size += size
        now_ms = math.floor(now * 1000)
        if now_ms != self._clock_ms:  # the calls of one millisecond share its argument
            self._clock_ms, self._clock = now_ms, _clock_arg(now_ms)
        return entry[1] + self._clock

    async def ping(self) -> None:
        """Readiness: every node the store needs answers a PING within the wait.

        Also sets ``meshplane_ratelimit_redis_unreachable``, which says that
        Redis is down even when readiness does not (failureMode allow/deny).
        """
        deadline = asyncio.get_running_loop().time() + max(self._timeout, 0.5)
        try:
            # The deadline expires the PING's reply future (which also detects a
            # stalled connection); the outer timeout is only a safety net, a bit
            # later so that it does not pre-empt that.
            async with asyncio.timeout_at(deadline + 0.05):
                await self._client.ping(deadline)
        except (RedisConnectionError, RedisReplyError, TimeoutError) as exc:
            metrics.REDIS_UNREACHABLE.set(1)
            raise StoreUnavailable("ping_failed", str(exc) or type(exc).__name__) from exc
        metrics.REDIS_UNREACHABLE.set(0)

    async def close(self) -> None:
        metrics.REDIS_UNREACHABLE.set(0)  # no longer the store in force
        await self._client.close()
