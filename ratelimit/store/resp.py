"""A lean pipelining Redis client for the one command of the hot path.

Why not redis-py here: its pipeline machinery costs several hundred
microseconds of Python per call, more than the whole decision, which would
have held the service far below the bench target. The hot path needs only
EVALSHA/EVAL with keys, so this module speaks RESP directly:

- one connection per Redis node per worker, shared by all concurrent calls
  (Redis answers in order, so replies are matched to a FIFO of futures);
- commands issued during one event-loop turn are written with one ``write``
  (they share a round trip), and replies read together are dispatched together;
- replies are parsed by hiredis (C);
- TLS, AUTH (user + password) and SELECT on connect; reconnects lazily with a
  connect timeout, so a missing Redis never blocks or crashes startup.

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
import ssl
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

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


def _expire(future: asyncio.Future[Reply]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


class _Protocol(asyncio.Protocol):
    """One connection: replies matched FIFO; writes corked while a batch is out.

    While written commands await their replies, new commands only queue; the
    queue is written in one piece when the last reply of the batch arrives
    (or at once when nothing is outstanding). Under load
    this turns many small writes into a few large ones on both ends, the
    same effect as Nagle's algorithm but bounded by one Redis round trip.
    """

    def __init__(self, on_flush: Callable[[], None] | None, window: float = 0.0) -> None:
        self._reader = hiredis.Reader()
        self._waiters: deque[asyncio.Future[Reply]] = deque()
        self._transport: asyncio.Transport | None = None
        self._buffer: list[bytes] = []
        self._outstanding = 0  # written commands still waiting for a reply
        self._on_flush = on_flush
        self._window = window
        self._timer: asyncio.TimerHandle | None = None
        self.loop = asyncio.get_running_loop()
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        while True:
            reply = self._reader.gets()
            if reply is False:
                return
            if not self._waiters:  # pragma: no cover - a reply nobody asked for
                log.error("unexpected reply from Redis; closing the connection")
                self.close()
                return
            waiter = self._waiters.popleft()
            self._outstanding -= 1
            if not waiter.done():
                waiter.set_result(reply)
            if self._outstanding == 0 and self._buffer:
                self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._buffer.clear()
        error = RedisConnectionError(f"connection to Redis lost: {exc or 'closed'}")
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(error)

    def send(self, commands: Sequence[bytes]) -> list[asyncio.Future[Reply]]:
        """Queue commands for this turn's write; one future per command."""
        if self.closed or self._transport is None:
            raise RedisConnectionError("connection to Redis is closed")
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in commands]
        self._waiters.extend(futures)
        self._buffer.extend(commands)
        if self._outstanding == 0:
            if self._window <= 0:
                # Nothing out: write at once (waiting for the end of the loop
                # turn would cost an iteration per request when calls trickle in).
                self._flush()
            elif self._timer is None:
                # A pipeline window: hold the first command briefly so that the
                # calls arriving meanwhile share its write and round trip.
                self._timer = loop.call_later(self._window, self._flush)
        return futures

    def send_one(self, command: bytes) -> asyncio.Future[Reply]:
        """:meth:`send` for one command (the hot path: no lists)."""
        if self.closed or self._transport is None:
            raise RedisConnectionError("connection to Redis is closed")
        future: asyncio.Future[Reply] = self.loop.create_future()
        self._waiters.append(future)
        self._buffer.append(command)
        if self._outstanding == 0:
            if self._window <= 0:
                self._flush()
            elif self._timer is None:
                self._timer = self.loop.call_later(self._window, self._flush)
        return future

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._outstanding or not self._buffer or self._transport is None or self.closed:
            return
        data = b"".join(self._buffer)
        self._outstanding = len(self._buffer)
        self._buffer.clear()
        self._transport.write(data)
        if self._on_flush is not None:
            self._on_flush()

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
        pipeline_window: float = 0.0,
    ) -> None:
        self._address = address
        self._target = target
        self._ssl = ssl_ctx
        self._connect_timeout = connect_timeout
        self._select_db = select_db
        self._on_flush = on_flush
        self._window = pipeline_window
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Task[_Protocol] | None = None

    async def _resolve(self) -> tuple[str, int]:
        if isinstance(self._address, tuple):
            return self._address
        host, port = await self._address()
        return str(host), int(port)

    async def _connect(self) -> _Protocol:
        host, port = await self._resolve()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, protocol = await loop.create_connection(
                    lambda: _Protocol(self._on_flush, self._window),
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
                if setup:
                    for reply in await asyncio.gather(*protocol.send(setup)):
                        if isinstance(reply, hiredis.ReplyError):
                            protocol.close()
                            # The reply names the failure (e.g. WRONGPASS), never the secret.
                            raise RedisConnectionError(
                                f"Redis refused the connection setup: {reply}"
                            )
        except (OSError, TimeoutError) as exc:
            raise RedisConnectionError(
                f"cannot connect to Redis at {host}:{port}: {exc!r}"
            ) from exc
        return protocol

    async def connection(self) -> _Protocol:
        protocol = self._protocol
        if protocol is not None and not protocol.closed:
            return protocol
        if self._connecting is None:
            self._connecting = asyncio.get_running_loop().create_task(self._connect())
            # Callers may give up (deadline) while the connect goes on; its
            # failure must still count as retrieved.
            self._connecting.add_done_callback(_retrieve)
        connecting = self._connecting
        try:
            protocol = await asyncio.shield(connecting)
        finally:
            if connecting.done() and self._connecting is connecting:
                self._connecting = None
        self._protocol = protocol
        return protocol

    async def execute(
        self, *commands: Sequence[Arg] | bytes, deadline: float | None = None
    ) -> list[Reply]:
        """Send commands back to back; the replies in order (errors as ReplyError).

        ``deadline`` (event-loop time) bounds the wait; past it TimeoutError is
        raised. The expiry is set on the reply future itself, not by
        cancelling the caller: a reply read before the deadline is never lost
        to a timer that fires in the same loop turn, which matters when the
        loop is saturated.
        """
        protocol = self._protocol
        if protocol is None or protocol.closed:
            if deadline is None:
                protocol = await self.connection()
            else:
                async with asyncio.timeout_at(deadline):
                    protocol = await self.connection()
        futures = protocol.send([c if isinstance(c, bytes) else pack(c) for c in commands])
        timer = None
        if deadline is not None:
            timer = asyncio.get_running_loop().call_at(deadline, _expire, futures[-1])
        try:
            if len(futures) == 1:
                return [await futures[0]]
            return list(await asyncio.gather(*futures))
        finally:
            if timer is not None:
                timer.cancel()

    async def execute_one(self, command: bytes, deadline: float | None) -> Reply:
        """One packed command, its reply (an error as ReplyError); the hot path.

        Same contract as :meth:`execute`, without its lists.
        """
        protocol = self._protocol
        if protocol is None or protocol.closed:
            if deadline is None:
                protocol = await self.connection()
            else:
                async with asyncio.timeout_at(deadline):
                    protocol = await self.connection()
        future = protocol.send_one(command)
        if deadline is None:
            return await future
        timer = protocol.loop.call_at(deadline, _expire, future)
        try:
            return await future
        finally:
            timer.cancel()

    def reset(self) -> None:
        """Drop the connection; the next call reconnects (and re-resolves the address)."""
        if self._protocol is not None:
            self._protocol.close()
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

    async def execute_keyed(
        self, first_key: str, command: Sequence[Arg], deadline: float | None = None
    ) -> Reply:
        raise NotImplementedError

    async def execute_packed(self, first_key: str, command: bytes, deadline: float) -> Reply:
        """:meth:`execute_keyed` with the command already packed (the hot path)."""
        raise NotImplementedError

    async def ping(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


class SingleClient(KeyedClient):
    """Standalone Redis, or the master that the sentinels name."""

    def __init__(self, node: NodeClient) -> None:
        self._node = node

    async def execute_keyed(
        self, first_key: str, command: Sequence[Arg], deadline: float | None = None
    ) -> Reply:
        if deadline is None:
            (reply,) = await self._node.execute(command)
        else:
            reply = await self._node.execute_one(pack(command), deadline)
        return self._check(reply)

    async def execute_packed(self, first_key: str, command: bytes, deadline: float) -> Reply:
        return self._check(await self._node.execute_one(command, deadline))

    def _check(self, reply: Reply) -> Reply:
        if isinstance(reply, hiredis.ReplyError) and str(reply).startswith("READONLY"):
            # A Sentinel failover turned our server into a replica: reconnect,
            # which asks the sentinels for the new master.
            self._node.reset()
        return reply

    async def ping(self) -> None:
        (reply,) = await self._node.execute(["PING"])
        if isinstance(reply, hiredis.ReplyError):
            raise RedisReplyError(str(reply))

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
        pipeline_window: float = 0.0,
    ) -> None:
        self._target = target
        self._ssl = ssl_ctx
        self._connect_timeout = connect_timeout
        self._on_flush = on_flush
        self._window = pipeline_window
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
                pipeline_window=self._window,
            )
        return node

    async def _load_slots(self) -> None:
        errors = []
        seeds = list(dict.fromkeys([*self._nodes, *self._target.hosts]))
        for address in seeds:
            try:
                (reply,) = await self._node(address).execute(["CLUSTER", "SLOTS"])
            except RedisConnectionError as exc:
                errors.append(str(exc))
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

    async def execute_keyed(
        self, first_key: str, command: Sequence[Arg], deadline: float | None = None
    ) -> Reply:
        return await self._execute(first_key, pack(command), deadline)

    async def execute_packed(self, first_key: str, command: bytes, deadline: float) -> Reply:
        return await self._execute(first_key, command, deadline)

    async def _execute(self, first_key: str, command: bytes, deadline: float | None) -> Reply:
        if not self._loaded:
            if deadline is None:
                await self.refresh()
            else:
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

    async def ping(self) -> None:
        await self.refresh()
        masters = {a for a in self._slots if a is not None}
        if len(masters) == 0 or any(a is None for a in self._slots):
            raise RedisConnectionError("the cluster does not cover every slot")
        for address in masters:
            (reply,) = await self._node(address).execute(["PING"])
            if isinstance(reply, hiredis.ReplyError):
                raise RedisReplyError(str(reply))

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
    pipeline_window: float = 0.0,
) -> KeyedClient:
    """The client for the URL's topology; nothing is connected yet."""
    ctx = ssl_context(target)
    if target.mode == "cluster":
        return ClusterClient(target, ssl_ctx=ctx, connect_timeout=connect_timeout,
                             on_flush=on_flush, pipeline_window=pipeline_window)  # fmt: skip
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
        pipeline_window=pipeline_window,
    )
    return SingleClient(node)
