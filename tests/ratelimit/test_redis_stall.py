"""A Redis that stops answering without closing anything: SIGSTOP on a real
redis-server, the way a wedged server or a dead host (no RST) behaves.

What must hold: every wait stays bounded by the call timeout; calls whose
caller gave up while they were queued are never written, so nothing is
charged when the server wakes up; a connection that owes a reply too long is
given up, and so are the connections when the breaker opens; and once the
server answers again the service recovers on a fresh connection.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import grpc
import pytest

from ratelimit.breaker import CircuitBreaker
from ratelimit.buckets import Bucket, window_at
from ratelimit.redis_url import parse_redis_url
from ratelimit.settings import Settings
from ratelimit.store import StoreUnavailable
from ratelimit.store.redis import RedisStore
from ratelimit.store.resp import NodeClient, build_keyed_client, pack
from tests.ratelimit.conftest import (
    OK,
    T0,
    metric_value,
    request,
    serve_app,
    write_config,
)
from tests.support.redis_server import RedisServer

CONFIG = """\
domain: out
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 1000}
"""


@pytest.fixture
def server(private_redis: RedisServer) -> RedisServer:
    """The server these tests pause (their own)."""
    return private_redis


def _node(server: RedisServer, *, stall_after: float = float("inf")) -> NodeClient:
    return NodeClient(
        ("127.0.0.1", server.port),
        target=parse_redis_url(server.url),
        ssl_ctx=None,
        connect_timeout=0.5,
        stall_after=stall_after,
    )


async def test_calls_that_expired_while_queued_are_never_written(server: RedisServer) -> None:
    """The first call is written; the next two queue behind its reply. All
    three time out. When the server wakes up and answers the first, the two
    queued ones must be dropped, not written after it (their callers are
    gone; running them would charge buckets for nothing)."""
    node = _node(server)
    loop = asyncio.get_running_loop()
    try:
        (client_id,) = await node.execute(["CLIENT", "ID"])
        with server.paused():
            deadline = loop.time() + 0.2
            results = await asyncio.gather(
                *(
                    node.execute_one(pack(["INCR", key]), deadline)
                    for key in ("written", "queued-1", "queued-2")
                ),
                return_exceptions=True,
            )
            assert all(isinstance(r, TimeoutError) for r in results), results
        assert await node.execute_one(pack(["INCR", "after"]), loop.time() + 5) == 1
        (values,) = await node.execute(["MGET", "written", "queued-1", "queued-2"])
        assert values == [b"1", None, None]
        # No stall limit here: the same connection carried on.
        assert await node.execute(["CLIENT", "ID"]) == [client_id]
    finally:
        await node.close()


async def test_a_connection_owing_a_reply_too_long_is_dropped(server: RedisServer) -> None:
    """Past ``stall_after`` the connection is given up; the next call
    reconnects, and the reconnect's PING keeps a paused server (which still
    accepts TCP) from being handed a call it would run much later."""
    node = _node(server, stall_after=0.3)
    loop = asyncio.get_running_loop()
    try:
        (first_id,) = await node.execute(["CLIENT", "ID"])
        with server.paused():
            now = loop.time()
            written = node.execute_one(pack(["INCR", "written"]), now + 0.2)
            # Expires 0.4 s after the write, past stall_after: the connection goes.
            queued = node.execute_one(pack(["INCR", "queued"]), now + 0.4)
            results = await asyncio.gather(written, queued, return_exceptions=True)
            assert all(isinstance(r, TimeoutError) for r in results), results
            assert loop.time() - now < 0.6
            started = loop.time()
            with pytest.raises(TimeoutError):
                await node.execute_one(pack(["INCR", "reconnecting"]), started + 0.2)
            assert loop.time() - started < 0.4
        await asyncio.sleep(0.6)  # any connect begun while paused has ended
        assert await node.execute_one(pack(["INCR", "after"]), loop.time() + 5) == 1
        (second_id,) = await node.execute(["CLIENT", "ID"])
        assert second_id != first_id
        (values,) = await node.execute(["MGET", "written", "queued", "reconnecting"])
        # Only the call written before the stall may have run (late, when the
        # server woke up); nothing queued or sent after it did.
        assert values[0] in (b"1", None) and values[1:] == [None, None]
    finally:
        await node.close()


async def test_the_breaker_opening_drops_the_connections(server: RedisServer) -> None:
    """When the breaker opens, calls still queued on the connection fail at
    once instead of each waiting out its own timeout, and the trial call
    after the open period goes out on a new connection."""
    client = build_keyed_client(parse_redis_url(server.url), connect_timeout=0.5)
    breaker = CircuitBreaker(failure_threshold=1, open_seconds=0.3, min_streak_seconds=0)
    store = RedisStore(client, timeout=0.2, breaker=breaker)  # stall limit: 0.4 s
    loop = asyncio.get_running_loop()
    window = window_at(60, T0)

    def bucket(name: str) -> list[Bucket]:
        return [Bucket(f"rl:{{t}}:{name}", 10, 1, window, False)]

    try:
        await store.apply(bucket("warm"), T0)
        with server.paused():
            start = loop.time()
            first = asyncio.ensure_future(store.apply(bucket("first"), T0))
            await asyncio.sleep(0.1)
            second = asyncio.ensure_future(store.apply(bucket("second"), T0))
            ended: list[float] = []
            second.add_done_callback(lambda _: ended.append(loop.time() - start))
            results = await asyncio.gather(first, second, return_exceptions=True)
            reasons = [r.reason if isinstance(r, StoreUnavailable) else r for r in results]
            # The first timed out and opened the breaker, which failed the
            # second at that moment (0.2 s), before its own deadline (0.3 s).
            assert reasons == ["timeout", "redis_error"]
            assert ended[0] < 0.28
            with pytest.raises(StoreUnavailable) as info:
                await store.apply(bucket("refused"), T0)
            assert info.value.reason == "breaker_open"
        await asyncio.sleep(0.6)  # the open period and any connect begun while paused
        outcome = await store.apply(bucket("after"), T0)
        assert outcome.allowed and outcome.counts == (1,)
        assert server.command("exists", "rl:{t}:second", "rl:{t}:refused").strip() == "0"
    finally:
        await store.close()


def _service_clients(server: RedisServer) -> set[int]:
    """Ids of the connections that are not this redis-cli's own."""
    ids = set()
    for line in server.command("client", "list").splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if fields.get("cmd") != "client|list":
            ids.add(int(fields["id"]))
    return ids


async def test_a_stalled_redis_end_to_end(server: RedisServer, tmp_path: Path) -> None:
    """The audit's scenario through the whole service: concurrent calls
    during a pause are answered within the timeout, the breaker opens,
    nothing queued during the pause is charged when Redis resumes, and the
    service reconnects and counts on."""
    config = write_config(tmp_path, "out.yaml", CONFIG)
    timeout = 0.1
    settings = Settings(
        store_timeout=timeout,
        breaker_failures=2,
        breaker_open_seconds=0.3,
        breaker_min_streak_seconds=0.05,
    )
    loop = asyncio.get_running_loop()
    async with serve_app(config, redis_url=server.url, settings=settings) as svc:
        for _ in range(2):
            assert (await svc.call(request("out", [("client", "before")]))).overall_code == OK
        clients_before = _service_clients(server)
        breaker_before = metric_value(
            "meshplane_ratelimit_store_errors_total", 'reason="breaker_open"'
        )

        async def timed(i: int) -> tuple[float, str]:
            started = loop.time()
            try:
                await svc.call(request("out", [("client", f"stalled-{i}")]))
                outcome = "OK"
            except grpc.aio.AioRpcError as exc:
                outcome = exc.code().name
            return loop.time() - started, outcome

        with server.paused():
            calls = []
            for i in range(100):  # 1 s of calls, several in flight at any time
                calls.append(asyncio.ensure_future(timed(i)))
                await asyncio.sleep(0.01)
            results = await asyncio.gather(*calls)
            await svc.wait_serving(False, timeout=3)  # failureMode unavailable
        assert {outcome for _, outcome in results} == {"UNAVAILABLE"}
        # Bounded by the timeout (plus gRPC on a busy machine), never by the pause.
        assert max(elapsed for elapsed, _ in results) < timeout + 0.3
        assert (
            metric_value("meshplane_ratelimit_store_errors_total", 'reason="breaker_open"')
            > breaker_before
        )

        await svc.wait_serving(True, timeout=10)
        async with asyncio.timeout(10):
            while True:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    resp = await svc.call(request("out", [("client", "after")]))
                    if resp.overall_code == OK:
                        break
                await asyncio.sleep(0.05)
        assert resp.statuses[0].limit_remaining == 999
        again = await svc.call(request("out", [("client", "before")]))
        assert again.statuses[0].limit_remaining == 997  # 2 before + this one, nothing replayed
        # Keys: "before", "after", and at most the one call written before the
        # stall was noticed; none of the ~100 that queued behind it.
        assert int(server.command("dbsize")) <= 3
        # The stuck connection was given up: the service talks over a new one.
        async with asyncio.timeout(5):
            while clients_before & _service_clients(server):
                await asyncio.sleep(0.05)
        assert _service_clients(server)
