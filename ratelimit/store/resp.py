"""A lean pipelining Redis client for the one command of the hot path.

Why not redis-py here: measured, one EVALSHA of a two-key script on uvloop
against a local redis-server costs this process 55-60 µs of CPU through
``redis.asyncio`` (hiredis parser) and 7-8 µs through this client, one call at
a time; with 32 calls in flight, 46 against 2 µs (``uv run --frozen python
bench/ratelimit/resp_client_cost.py``, docs/benchmarks.md). redis-py's share
alone would be more than the rest of a decision's Python (about 30 µs). The
hot path needs only EVALSHA/EVAL with keys, so this module speaks RESP
directly:

- one connection per Redis node per worker, shared by all concurrent calls
  (Redis answers in order, so replies are matched to a FIFO of futures);
- commands issued during one event-loop turn are written with one ``write``
  (they share a round trip), and replies read together are dispatched together;
- replies are parsed by hiredis (C);
- TLS, AUTH (user + password), SELECT and a PING on connect; reconnects
  lazily with a connect timeout, so a missing Redis never blocks or crashes
  startup;
- a stalled Redis costs bounded waits, never a replay: commands whose caller
  gave up are never written, and a connection owing a reply for too long is
  dropped (see :class:`_Protocol`).

Cluster: the slot map comes from ``CLUSTER SLOTS``; a call goes to the master
of its keys' slot (all of one call's keys share the domain's hash tag), with
MOVED (refresh the map, retry on the named node) and ASK (``ASKING`` + retry)
handled once. Sentinel: the master's address is asked from the sentinels
(redis-py's Sentinel, off the hot path) on every (re)connect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import ssl
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import hiredis
from redis.asyncio.sentinel import Sentinel
from redis.crc import key_slot

from ratelimit.redis_url import RedisTarget

log = logging.getLogger(__name__)

Arg = str | int | bytes
Reply = Any


class RedisConnectionError(ConnectionError):
    """The connection to Redis failed or was lost."""


class RedisReplyError(Exception):
    """Redis answered with an error reply (``-ERR ...``)."""


def script_missing(reply: object) -> bool:
    """Whether ``reply`` is Redis's NOSCRIPT: the server's script cache lacks the
    EVALSHA's script (after a restart, a failover or SCRIPT FLUSH), so the caller
    sends it once with EVAL, which loads it again."""
    return isinstance(reply, hiredis.ReplyError) and str(reply).startswith("NOSCRIPT")


def pack(args: Sequence[Arg]) -> bytes:
    """Encode one command as a RESP array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    append = out.append
    for arg in args:
        raw = arg if isinstance(arg, bytes) else str(arg).encode()
        append(b"$%d\r\n%b\r\n" % (len(raw), raw))
    return b"".join(out)


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


@dataclass(frozen=True)
class Pipelining:
    """When a connection holds a write back so that later calls can share it.

    ``window`` (seconds, 0: never hold) is the longest a first command waits
    for company; ``limit`` (0: none) writes the queue as soon as it holds that
    many commands. Like the reference's ``REDIS_PIPELINE_WINDOW`` and
    ``REDIS_PIPELINE_LIMIT``, except that a connection only holds a write
    when that pays:

    - calls must arrive more often than once per window (a moving average of
      the gaps between them): sparse traffic is written at once;
    - held writes must actually be shared (a moving average of the commands
      they carried of at least 1.5): a caller that sends one call at a time
      and waits for each, however fast, would only ever wait for nobody.
      Then only every 64th write is held, to notice when company returns.
    """

    window: float = 0.0
    limit: int = 0


#: Weight of the newest sample in the moving averages (as in TCP's RTT estimate).
_WEIGHT = 0.125
#: A gap longer than this counts as this long: after an idle spell the average
#: recovers within a few dozen calls.
_GAP_CAP = 1.0
#: Held writes must carry this many commands on average to go on being held.
_WORTH_HOLDING = 1.5
#: While holding does not pay, one write in this many is held all the same.
_PROBE_EVERY = 64


class _Protocol(asyncio.Protocol):
    """One connection: replies matched FIFO; writes corked while a batch is out.

    While written commands await their replies, new commands only queue; the
    queue is written in one piece when the last reply of the batch arrives.
    When nothing is outstanding, a command is written at once, or, while
    calls arrive more often than once per pipelining window, held for up to
    that window (or until ``limit`` commands are queued) so that the calls
    arriving meanwhile share its write (see :class:`Pipelining`). Under load
    this turns many small writes into a few large ones on both ends, the
    same effect as Nagle's algorithm but bounded by a round trip or a window.

    Invariant: ``_waiters`` holds the futures of the ``_outstanding`` written
    commands, then one future per ``_buffer`` entry, in order; ``_deadlines``
    holds each waiter's deadline (loop time), aligned with ``_waiters``.

    Deadlines: one timer per connection, at the earliest pending deadline,
    rather than one per call (creating and cancelling a timer on every call
    was a measurable part of a decision). It fails the calls whose deadline
    has passed with TimeoutError, on their reply futures rather than by
    cancelling the callers: timers run after the loop turn's I/O callbacks,
    so a reply read before the deadline is never lost to a timer firing in
    the same turn, and a connection is never judged stalled while its reply
    sits unread. Then it re-arms for the next pending deadline.

    Two rules keep a stalled Redis (paused, overloaded, or a host gone without
    a RST) from doing harm:

    - a queued command whose caller already gave up (its future is done:
      expired at its deadline, or cancelled) is dropped when the queue is
      written, so Redis never executes, and charges, a decision that nobody
      waits for any more;
    - when a call expires while the oldest written command has waited longer
      than ``stall_after`` seconds, the connection is aborted: every waiter
      fails at once and the next call reconnects (re-resolving a Sentinel
      master) instead of queueing forever behind a reply that may never come.
    """

    def __init__(
        self,
        on_flush: Callable[[], None] | None,
        pipelining: Pipelining = Pipelining(),
        stall_after: float = math.inf,
    ) -> None:
        self._reader = hiredis.Reader()
        self._waiters: deque[asyncio.Future[Reply]] = deque()
        self._deadlines: deque[float] = deque()
        self._expiry: asyncio.TimerHandle | None = None
        self._expiry_at = math.inf
        self._transport: asyncio.Transport | None = None
        self._buffer: list[bytes] = []
        self._outstanding = 0  # written commands still waiting for a reply
        self._written_at = 0.0  # loop time of the write that the outstanding replies answer
        self._on_flush = on_flush
        self._window = pipelining.window
        self._limit = pipelining.limit
        self._timer: asyncio.TimerHandle | None = None
        self._last_call = 0.0  # loop time of the previous send_one
        self._gap = _GAP_CAP  # moving average of the gaps between calls
        self._shared = 2 * _WORTH_HOLDING  # moving average of the commands a held write carried
        self._unheld = 0  # writes not held since the last probe
        self.stall_after = stall_after
        self.loop = asyncio.get_running_loop()
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Duck-typed: uvloop's transports (the hot-path server's loop) are not
        # subclasses of asyncio.Transport, though they have its methods.
        self._transport = cast("asyncio.Transport", transport)

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        while True:
            reply = self._reader.gets()
            if reply is False:
                return
            if not self._outstanding:  # pragma: no cover - a reply nobody asked for
                log.error("unexpected reply from Redis; closing the connection")
                self.abort("unexpected reply from Redis")
                return
            waiter = self._waiters.popleft()
            self._deadlines.popleft()
            self._outstanding -= 1
            if not waiter.done():
                waiter.set_result(reply)
            if self._outstanding == 0 and self._buffer:
                self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(RedisConnectionError(f"connection to Redis lost: {exc or 'closed'}"))

    def _fail(self, error: RedisConnectionError) -> None:
        """Mark the connection closed and fail every waiter; nothing queued is written."""
        self.closed = True
        for timer in (self._timer, self._expiry):
            if timer is not None:
                timer.cancel()
        self._timer = self._expiry = None
        self._expiry_at = math.inf
        self._buffer.clear()
        self._deadlines.clear()
        self._outstanding = 0
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(error)

    def send(
        self, commands: Sequence[bytes], deadline: float = math.inf
    ) -> list[asyncio.Future[Reply]]:
        """Queue commands back to back; one future per command, written together.

        Each future fails with TimeoutError if its reply has not come by
        ``deadline`` (loop time). Not the hot path (connection setup, PING):
        never held for company, written at once unless a batch is out.
        """
        if self.closed or self._transport is None:
            raise RedisConnectionError("connection to Redis is closed")
        futures: list[asyncio.Future[Reply]] = []
        for command in commands:
            future: asyncio.Future[Reply] = self.loop.create_future()
            self._waiters.append(future)
            self._deadlines.append(deadline)
            self._buffer.append(command)
            futures.append(future)
        if deadline < self._expiry_at:
            self._arm_expiry(deadline)
        self._flush()
        return futures

    def send_one(self, command: bytes, deadline: float = math.inf) -> asyncio.Future[Reply]:
        """Queue one command (the hot path: no lists); its reply's future, which
        fails with TimeoutError if the reply has not come by ``deadline``."""
        if self.closed or self._transport is None:
            raise RedisConnectionError("connection to Redis is closed")
        future: asyncio.Future[Reply] = self.loop.create_future()
        self._waiters.append(future)
        self._deadlines.append(deadline)
        if deadline < self._expiry_at:
            self._arm_expiry(deadline)
        self._buffer.append(command)
        frequent = self._window > 0 and self._calls_are_frequent()
        if self._outstanding:
            return future  # corked: written when the batch out has been answered
        if self._timer is None:
            if frequent and self._holding_pays():
                # Hold the first command briefly so that the calls arriving
                # meanwhile share its write and round trip.
                self._timer = self.loop.call_later(self._window, self._flush)
            else:
                # Write at once (waiting for the end of the loop turn would
                # cost an iteration per request when calls trickle in).
                # Everything queued was queued just now: nothing to prune.
                self._write()
        elif self._limit and len(self._buffer) >= self._limit:
            self._flush()
        return future

    def _calls_are_frequent(self) -> bool:
        """Record this call; whether calls come more often than once per window."""
        now = self.loop.time()
        gap = now - self._last_call
        gap = gap if gap < _GAP_CAP else _GAP_CAP  # not min(): a builtin call costs more
        self._last_call = now
        self._gap += (gap - self._gap) * _WEIGHT
        return self._gap < self._window

    def _holding_pays(self) -> bool:
        """Whether held writes have been shared lately; if not, hold only a probe."""
        if self._shared >= _WORTH_HOLDING:
            return True
        self._unheld += 1
        if self._unheld < _PROBE_EVERY:
            return False
        self._unheld = 0
        return True

    def _flush(self) -> None:
        """Write the queue, without the commands whose callers gave up meanwhile."""
        timer, self._timer = self._timer, None
        held = timer is not None  # a held write: its size says whether holding pays
        if timer is not None:
            timer.cancel()
        if self._outstanding or not self._buffer or self._transport is None or self.closed:
            return
        # Nothing is outstanding: the waiters are exactly the queued commands'.
        for waiter in self._waiters:
            if waiter.done():
                self._prune()
                break
        if self._buffer:
            if held:
                self._shared += (len(self._buffer) - self._shared) * _WEIGHT
            self._write()

    def _prune(self) -> None:
        kept = [
            (w, d, c)
            for w, d, c in zip(self._waiters, self._deadlines, self._buffer, strict=True)
            if not w.done()
        ]
        self._waiters = deque(w for w, _, _ in kept)
        self._deadlines = deque(d for _, d, _ in kept)
        self._buffer = [c for _, _, c in kept]

    def _write(self) -> None:
        assert self._transport is not None
        buffer = self._buffer
        self._outstanding = len(buffer)
        data = b"".join(buffer)
        buffer.clear()
        self._written_at = self.loop.time()
        self._transport.write(data)
        if self._on_flush is not None:
            self._on_flush()

    def _arm_expiry(self, at: float) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry = self.loop.call_at(at, self._expire_due)
        self._expiry_at = at

    def _expire_due(self) -> None:
        """Fail the calls past their deadline; abort a stalled connection; re-arm."""
        self._expiry, self._expiry_at = None, math.inf
        now = self.loop.time()
        expired = False
        next_at = math.inf
        for waiter, deadline in zip(self._waiters, self._deadlines, strict=True):
            if waiter.done():
                continue
            if deadline <= now:
                waiter.set_exception(TimeoutError())
                expired = True
            elif deadline < next_at:
                next_at = deadline
        if expired and self._outstanding and not self.closed:
            waited = now - self._written_at
            if waited >= self.stall_after:
                log.warning(
                    "no reply from Redis; dropping the connection",
                    extra={"waited_ms": round(waited * 1000), "owed": self._outstanding},
                )
                self.abort(f"no reply from Redis for {waited * 1000:.0f} ms")
                return
        if next_at < math.inf:
            self._arm_expiry(next_at)

    def abort(self, reason: str) -> None:
        """Drop the connection now: waiters fail, queued commands are never written."""
        if self.closed:
            return
        self._fail(RedisConnectionError(reason))
        if self._transport is not None:
            self._transport.abort()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


def ssl_context(target: RedisTarget) -> ssl.SSLContext | None:
    """The client TLS context of ``rediss://`` URLs."""
    if not target.tls:
        return None
    ctx = ssl.create_default_context(cafile=target.ssl_ca_certs)
    if target.ssl_certfile:
        ctx.load_cert_chain(target.ssl_certfile, target.ssl_keyfile)
    if target.ssl_cert_reqs == "none":
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ctx.check_hostname = target.ssl_check_hostname
    return ctx


class NodeClient:
    """A lazily (re)connected pipelining connection to one Redis server."""

    def __init__(
        self,
        address: tuple[str, int] | Callable[[], Any],
        *,
        target: RedisTarget,
        ssl_ctx: ssl.SSLContext | None,
        connect_timeout: float,
        select_db: bool = True,
        on_flush: Callable[[], None] | None = None,
        pipelining: Pipelining = Pipelining(),
        stall_after: float = math.inf,
    ) -> None:
        self._address = address
        self._target = target
        self._ssl = ssl_ctx
        self._connect_timeout = connect_timeout
        self._select_db = select_db
        self._on_flush = on_flush
        self._pipelining = pipelining
        self._stall_after = stall_after
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Task[_Protocol] | None = None

    @property
    def live(self) -> _Protocol | None:
        """The connection if it is up (no connecting, no waiting)."""
        protocol = self._protocol
        return protocol if protocol is not None and not protocol.closed else None

    def set_stall_timeout(self, seconds: float) -> None:
        """Abort the connection when a reply is owed for longer than this (see _Protocol)."""
        self._stall_after = seconds
        if self._protocol is not None:
            self._protocol.stall_after = seconds

    async def _resolve(self) -> tuple[str, int]:
        if isinstance(self._address, tuple):
            return self._address
        host, port = await self._address()
        return str(host), int(port)

    async def _connect(self) -> _Protocol:
        """Connect, authenticate, select the db, and PING.

        The PING (whose reply comes after AUTH's and SELECT's) proves that the
        server answers, not just that the kernel accepted the connection: a
        paused or wedged redis-server still completes TCP handshakes from its
        listen backlog, and a call written to such a connection would run
        whenever the server wakes up, long after its caller gave up.
        """
        host, port = await self._resolve()
        loop = asyncio.get_running_loop()
        protocol: _Protocol | None = None
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, protocol = await loop.create_connection(
                    lambda: _Protocol(self._on_flush, self._pipelining, self._stall_after),
                    host,
                    port,
                    ssl=self._ssl,
                    server_hostname=host if self._ssl is not None else None,
                )
                setup: list[bytes] = []
                if self._target.password is not None:
                    auth: list[Arg] = ["AUTH"]
                    if self._target.username:
                        auth.append(self._target.username)
                    auth.append(self._target.password)
                    setup.append(pack(auth))
                if self._select_db and self._target.db:
                    setup.append(pack(["SELECT", self._target.db]))
                setup.append(pack(["PING"]))
                replies = await asyncio.gather(*protocol.send(setup))
            for reply in replies:
                if isinstance(reply, hiredis.ReplyError):
                    # The reply names the failure (e.g. WRONGPASS), never the secret.
                    raise RedisConnectionError(f"Redis refused the connection setup: {reply}")
        except BaseException as exc:
            if protocol is not None:
                protocol.abort("connection setup failed")
            if isinstance(exc, (OSError, TimeoutError)) and not isinstance(
                exc, RedisConnectionError
            ):
                raise RedisConnectionError(
                    f"cannot connect to Redis at {host}:{port}: {exc!r}"
                ) from exc
            raise
        return protocol

    async def connection(self) -> _Protocol:
        """The live connection, connecting first if needed (one attempt for all callers)."""
        protocol = self._protocol
        if protocol is not None and not protocol.closed:
            return protocol
        connecting = self._connecting
        if connecting is None:
            connecting = self._connecting = asyncio.get_running_loop().create_task(self._connect())
            # Callers may give up (deadline) while the connect goes on: the
            # task itself installs its result and clears itself, so the next
            # caller never inherits a stale failure.
            connecting.add_done_callback(self._connected)
        return await asyncio.shield(connecting)

    def _connected(self, task: asyncio.Task[_Protocol]) -> None:
        if self._connecting is task:
            self._connecting = None
        if not task.cancelled() and task.exception() is None:
            self._protocol = task.result()

    async def _connection_by(self, deadline: float | None) -> _Protocol:
        protocol = self._protocol
        if protocol is not None and not protocol.closed:
            return protocol
        if deadline is None:
            return await self.connection()
        async with asyncio.timeout_at(deadline):
            return await self.connection()

    async def execute(
        self, *commands: Sequence[Arg] | bytes, deadline: float | None = None
    ) -> list[Reply]:
        """Send commands back to back; the replies in order (errors as ReplyError).

        ``deadline`` (event-loop time) bounds the wait; past it TimeoutError is
        raised. The expiry is set on the reply future itself, not by
        cancelling the caller (see :class:`_Protocol`).
        """
        protocol = await self._connection_by(deadline)
        futures = protocol.send(
            [c if isinstance(c, bytes) else pack(c) for c in commands],
            math.inf if deadline is None else deadline,
        )
        return list(await asyncio.gather(*futures))

    async def execute_one(self, command: bytes, deadline: float | None) -> Reply:
        """One packed command, its reply (an error as ReplyError); the hot path.

        Same contract as :meth:`execute`, without its lists and gather.
        """
        protocol = self._protocol
        if protocol is None or protocol.closed:
            protocol = await self._connection_by(deadline)
        return await protocol.send_one(command, math.inf if deadline is None else deadline)

    def reset(self) -> None:
        """Drop the connection now; the next call reconnects (and re-resolves the address).

        Whatever is queued on it is never written, and its waiters fail at once.
        """
        if self._protocol is not None:
            self._protocol.abort("connection reset")
            self._protocol = None

    async def close(self) -> None:
        if self._connecting is not None:
            self._connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._connecting
        if self._protocol is not None:
            self._protocol.close()
            self._protocol = None


class KeyedClient:
    """Runs one command whose keys all share a slot; the interface the store uses."""

    async def execute_packed(self, first_key: str, command: bytes, deadline: float) -> Reply:
        """Run a packed command on the node that owns ``first_key``'s slot."""
        raise NotImplementedError

    def send_packed(self, command: bytes, deadline: float) -> asyncio.Future[Reply] | None:
        """The hot path's shortcut: when the command can be written on a live
        connection as it is, queue it and return its reply's future (await it,
        then hand an error reply to :meth:`replied_error`); None when only
        :meth:`execute_packed` can run it (no connection yet, Cluster routing).

        Awaiting the future itself spares the two coroutines of
        :meth:`execute_packed` on every call.
        """
        return None

    def replied_error(self, reply: hiredis.ReplyError) -> None:
        """What :meth:`execute_packed` does on an error reply (a sent future's)."""

    async def ping(self, deadline: float) -> None:
        raise NotImplementedError

    def set_stall_timeout(self, seconds: float) -> None:
        """How long a reply may be owed before a connection is given up (see _Protocol)."""
        raise NotImplementedError

    def reset(self) -> None:
        """Drop every connection now (the store's breaker opened); calls reconnect."""
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


class SingleClient(KeyedClient):
    """Standalone Redis, or the master that the sentinels name."""

    def __init__(self, node: NodeClient) -> None:
        self._node = node

    async def execute_packed(self, first_key: str, command: bytes, deadline: float) -> Reply:
        reply = await self._node.execute_one(command, deadline)
        if isinstance(reply, hiredis.ReplyError):
            self.replied_error(reply)
        return reply

    def send_packed(self, command: bytes, deadline: float) -> asyncio.Future[Reply] | None:
        protocol = self._node.live
        if protocol is None:
            return None
        return protocol.send_one(command, deadline)

    def replied_error(self, reply: hiredis.ReplyError) -> None:
        if str(reply).startswith("READONLY"):
            # A Sentinel failover turned our server into a replica: reconnect,
            # which asks the sentinels for the new master.
            self._node.reset()

    async def ping(self, deadline: float) -> None:
        (reply,) = await self._node.execute(["PING"], deadline=deadline)
        if isinstance(reply, hiredis.ReplyError):
            raise RedisReplyError(str(reply))

    def set_stall_timeout(self, seconds: float) -> None:
        self._node.set_stall_timeout(seconds)

    def reset(self) -> None:
        self._node.reset()

    async def close(self) -> None:
        await self._node.close()


_SLOTS = 16384


class ClusterClient(KeyedClient):
    """Redis Cluster: route by slot, follow MOVED/ASK once."""

    def __init__(
        self,
        target: RedisTarget,
        *,
        ssl_ctx: ssl.SSLContext | None,
        connect_timeout: float,
        on_flush: Callable[[], None] | None = None,
        pipelining: Pipelining = Pipelining(),
    ) -> None:
        self._target = target
        self._ssl = ssl_ctx
        self._connect_timeout = connect_timeout
        self._on_flush = on_flush
        self._pipelining = pipelining
        self._stall_after = math.inf
        self._nodes: dict[tuple[str, int], NodeClient] = {}
        self._slots: list[tuple[str, int] | None] = [None] * _SLOTS
        self._refreshing: asyncio.Task[None] | None = None
        self._loaded = False

    def _node(self, address: tuple[str, int]) -> NodeClient:
        node = self._nodes.get(address)
        if node is None:
            node = self._nodes[address] = NodeClient(
                address,
                target=self._target,
                ssl_ctx=self._ssl,
                connect_timeout=self._connect_timeout,
                select_db=False,
                on_flush=self._on_flush,
                pipelining=self._pipelining,
                stall_after=self._stall_after,
            )
        return node

    async def _load_slots(self) -> None:
        errors = []
        seeds = list(dict.fromkeys([*self._nodes, *self._target.hosts]))
        loop = asyncio.get_running_loop()
        for address in seeds:
            # Each seed gets its own bounded wait: a node that accepts but never
            # answers must not hold the refresh (shared by every caller) forever.
            deadline = loop.time() + self._connect_timeout
            try:
                (reply,) = await self._node(address).execute(
                    ["CLUSTER", "SLOTS"], deadline=deadline
                )
            except (RedisConnectionError, TimeoutError) as exc:
                errors.append(f"{address[0]}:{address[1]}: {exc or 'timeout'}")
                continue
            if isinstance(reply, hiredis.ReplyError):
                errors.append(str(reply))
                continue
            slots: list[tuple[str, int] | None] = [None] * _SLOTS
            for entry in reply:
                start, end, master = int(entry[0]), int(entry[1]), entry[2]
                host = master[0].decode() if master[0] else address[0]
                owner = (host, int(master[1]))
                for slot in range(start, end + 1):
                    slots[slot] = owner
            self._slots = slots
            self._loaded = True
            return
        raise RedisConnectionError("no cluster node answered CLUSTER SLOTS: " + "; ".join(errors))

    def _start_refresh(self) -> asyncio.Task[None]:
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.get_running_loop().create_task(self._load_slots())
            self._refreshing.add_done_callback(_retrieve)
        return self._refreshing

    async def refresh(self) -> None:
        """Reload the slot map once, however many callers ask at the same time."""
        await asyncio.shield(self._start_refresh())

    async def execute_packed(self, first_key: str, command: bytes, deadline: float) -> Reply:
        if not self._loaded:
            async with asyncio.timeout_at(deadline):
                await self.refresh()
        slot = key_slot(first_key.encode())
        owner = self._slots[slot]
        if owner is None:
            raise RedisConnectionError(f"no cluster node serves slot {slot}")
        reply = await self._node(owner).execute_one(command, deadline)
        if isinstance(reply, hiredis.ReplyError):
            kind, _, rest = str(reply).partition(" ")
            if kind in ("MOVED", "ASK"):
                host, _, port = rest.split(" ")[-1].rpartition(":")
                address = (host or owner[0], int(port))
                if kind == "MOVED":
                    self._start_refresh()  # in the background; this call follows MOVED
                    reply = await self._node(address).execute_one(command, deadline)
                else:
                    _, reply = await self._node(address).execute(
                        ["ASKING"], command, deadline=deadline
                    )
        return reply

    async def ping(self, deadline: float) -> None:
        async with asyncio.timeout_at(deadline):
            await self.refresh()
        masters = {a for a in self._slots if a is not None}
        if len(masters) == 0 or any(a is None for a in self._slots):
            raise RedisConnectionError("the cluster does not cover every slot")
        for address in masters:
            (reply,) = await self._node(address).execute(["PING"], deadline=deadline)
            if isinstance(reply, hiredis.ReplyError):
                raise RedisReplyError(str(reply))

    def set_stall_timeout(self, seconds: float) -> None:
        self._stall_after = seconds
        for node in self._nodes.values():
            node.set_stall_timeout(seconds)

    def reset(self) -> None:
        for node in self._nodes.values():
            node.reset()
        # The outage may have been a failover: reload the slot map in the background.
        self._start_refresh()

    async def close(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()
        for node in self._nodes.values():
            await node.close()


def build_keyed_client(
    target: RedisTarget,
    *,
    connect_timeout: float = 1.0,
    on_flush: Callable[[], None] | None = None,
    pipelining: Pipelining = Pipelining(),
) -> KeyedClient:
    """The client for the URL's topology; nothing is connected yet."""
    ctx = ssl_context(target)
    if target.mode == "cluster":
        return ClusterClient(target, ssl_ctx=ctx, connect_timeout=connect_timeout,
                             on_flush=on_flush, pipelining=pipelining)  # fmt: skip
    if target.mode == "sentinel":
        sentinel_kwargs: dict[str, Any] = {
            "username": target.sentinel_username,
            "password": target.sentinel_password,
            "socket_timeout": connect_timeout,
            "socket_connect_timeout": connect_timeout,
        }
        if ctx is not None:
            sentinel_kwargs.update(
                ssl=True,
                ssl_ca_certs=target.ssl_ca_certs,
                ssl_certfile=target.ssl_certfile,
                ssl_keyfile=target.ssl_keyfile,
                ssl_cert_reqs=target.ssl_cert_reqs,
                ssl_check_hostname=target.ssl_check_hostname,
            )
        sentinel = Sentinel(list(target.hosts), sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
        assert target.master_name is not None
        master_name = target.master_name

        async def discover() -> Any:
            return await sentinel.discover_master(master_name)

        address: tuple[str, int] | Callable[[], Any] = discover
    else:
        address = target.hosts[0]
    node = NodeClient(
        address,
        target=target,
        ssl_ctx=ctx,
        connect_timeout=connect_timeout,
        on_flush=on_flush,
        pipelining=pipelining,
    )
    return SingleClient(node)
