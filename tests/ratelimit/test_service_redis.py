"""ShouldRateLimit end to end: real gRPC socket, real redis-server, fake clock.

Every test that uses ``svc`` runs twice: with the local cache of empty
buckets, as deployed, and without it. With the cache, a denial on a bucket
this process already saw empty is answered locally, so the Lua script's
all-or-nothing branch (deny, charge nothing) would never run; without it,
every decision goes through the script. The no-cache run checks that the
cache really answered nothing.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from envoy.service.ratelimit.v3 import rls_pb2

from ratelimit.settings import Settings
from tests.ratelimit.conftest import (
    OK,
    OVER,
    T0,
    FakeClock,
    Harness,
    descriptor,
    headers_of,
    metric_value,
    request,
    serve_app,
    write_config,
)
from tests.support.grpc_raw import raw_unary_aio
from tests.support.redis_server import RedisServer

CONFIG = """\
domain: api
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: route
    value: checkout
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: named
    rate_limit: {unit: second, requests_per_unit: 4, name: burst}
  - key: open
    rate_limit: {unlimited: true}
  - key: banned
    rate_limit: {unit: minute, requests_per_unit: 0, name: banned_limit}
  - key: override
    rate_limit:
      unit: minute
      requests_per_unit: 2
      replaces: [{name: banned_limit}]
  - key: thirty
    rate_limit: {unit: second, unit_multiplier: 30, requests_per_unit: 5}
  - key: five_min
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 2}
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 4, algorithm: sliding_window}
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return write_config(tmp_path, "api.yaml", CONFIG)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=[True, False], ids=["local-cache", "no-local-cache"])
def local_cache(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def service_settings(local_cache: bool, *, headers_enabled: bool = True) -> Settings:
    return Settings(
        store_timeout=0.5,
        local_cache_size=100_000 if local_cache else 0,
        headers_enabled=headers_enabled,
    )


@pytest.fixture
async def svc(
    config: Path, redis: RedisServer, clock: FakeClock, local_cache: bool
) -> AsyncIterator[Harness]:
    hits = metric_value("meshplane_ratelimit_local_cache_hits_total", "")
    settings = service_settings(local_cache)
    async with serve_app(config, redis_url=redis.url, clock=clock, settings=settings) as harness:
        yield harness
    if not local_cache:
        # Every decision of this run went through the script.
        assert metric_value("meshplane_ratelimit_local_cache_hits_total", "") == hits


def statuses(response: rls_pb2.RateLimitResponse) -> list[tuple[int, int]]:
    return [(s.code, s.limit_remaining) for s in response.statuses]


async def test_exhaustion_and_refill_when_the_window_turns(svc: Harness, clock: FakeClock) -> None:
    for expected in (4, 3, 2, 1, 0):
        resp = await svc.call(request("api", [("client", "alice")]))
        assert resp.overall_code == OK
        assert statuses(resp) == [(OK, expected)]
    status = resp.statuses[0]
    assert (status.current_limit.requests_per_unit, status.current_limit.unit) == (5, 2)
    assert status.duration_until_reset.seconds == 50  # T0 is 10 s into the minute
    denied = await svc.call(request("api", [("client", "alice")]))
    assert denied.overall_code == OVER and statuses(denied) == [(OVER, 0)]
    # Another value of a key-only rule has its own bucket.
    assert statuses(await svc.call(request("api", [("client", "bob")]))) == [(OK, 4)]
    clock.advance(49.9)
    assert (await svc.call(request("api", [("client", "alice")]))).overall_code == OVER
    clock.advance(0.2)  # the minute turned: full again
    assert statuses(await svc.call(request("api", [("client", "alice")]))) == [(OK, 4)]


async def test_two_rules_ored_and_the_other_bucket_untouched_on_deny(svc: Harness) -> None:
    both = request("api", [("client", "carol")], [("route", "checkout")])
    for remaining in ((4, 2), (3, 1), (2, 0)):
        resp = await svc.call(both)
        assert resp.overall_code == OK
        assert [s.limit_remaining for s in resp.statuses] == list(remaining)
    for _ in range(4):
        resp = await svc.call(both)
        assert resp.overall_code == OVER
        assert statuses(resp) == [(OK, 2), (OVER, 0)]
    # The client bucket really was not charged by the denied requests.
    alone = await svc.call(request("api", [("client", "carol")]))
    assert statuses(alone) == [(OK, 1)]


async def test_cost_per_request_and_per_descriptor(svc: Harness) -> None:
    two = request("api", [("client", "dan")], hits=2)
    assert statuses(await svc.call(two)) == [(OK, 3)]
    assert statuses(await svc.call(two)) == [(OK, 1)]
    # 1 left, cost 2: denied, and nothing is consumed.
    assert statuses(await svc.call(two)) == [(OVER, 1)]
    # Request-level 0 means 1.
    assert statuses(await svc.call(request("api", [("client", "dan")], hits=0))) == [(OK, 0)]
    # Per-descriptor 0 wins over the request's cost: a check; on an empty bucket it is denied.
    check = request("api", descriptor(("client", "dan"), hits=0), hits=3)
    assert statuses(await svc.call(check)) == [(OVER, 0)]
    fresh = request("api", descriptor(("client", "erin"), hits=0), hits=3)
    assert statuses(await svc.call(fresh)) == [(OK, 5)]  # a check consumes nothing
    mixed = request("api", descriptor(("client", "erin"), hits=4), [("client", "fay")], hits=2)
    assert statuses(await svc.call(mixed)) == [(OK, 1), (OK, 3)]
    # The same bucket twice in one request is charged the sum, once.
    dup = request("api", [("client", "gil")], [("client", "gil")])
    assert statuses(await svc.call(dup)) == [(OK, 3), (OK, 3)]


async def test_shadow_rules_count_but_never_deny(svc: Harness) -> None:
    before = metric_value("meshplane_ratelimit_shadow_mode_total", 'domain="api",rule="shadow"')
    codes = []
    for _ in range(4):
        resp = await svc.call(request("api", [("shadow", "x")]))
        codes.append((resp.overall_code, *statuses(resp)[0]))
    assert codes == [(OK, OK, 1), (OK, OK, 0), (OK, OK, 0), (OK, OK, 0)]
    after = metric_value("meshplane_ratelimit_shadow_mode_total", 'domain="api",rule="shadow"')
    assert after - before == 2
    # A shadow rule does not stop a real rule from denying, and headers still come.
    resp = await svc.call(request("api", [("shadow", "y")], [("banned", "z")]))
    assert resp.overall_code == OVER
    assert statuses(resp) == [(OK, 2), (OVER, 0)]


async def test_exact_header_strings(
    svc: Harness, config: Path, redis: RedisServer, local_cache: bool
) -> None:
    both = request("api", [("client", "hal")], [("route", "checkout")])
    resp = await svc.call(both)
    assert headers_of(resp) == {
        "x-ratelimit-limit": "3, 5;w=60, 3;w=3600",
        "x-ratelimit-remaining": "2",
        "x-ratelimit-reset": "3590",
    }
    await svc.call(both)
    await svc.call(both)
    denied = await svc.call(both)
    assert [(h.key, h.value) for h in denied.response_headers_to_add] == [
        ("x-ratelimit-limit", "3, 5;w=60, 3;w=3600"),
        ("x-ratelimit-remaining", "0"),
        ("x-ratelimit-reset", "3590"),
        ("x-proxy-ratelimited", "true"),
    ]
    named = await svc.call(request("api", [("named", "n")], [("open", "o")], [("x", "y")]))
    assert headers_of(named) == {
        "x-ratelimit-limit": '4, 4;w=1;name="burst"',
        "x-ratelimit-remaining": "3",
        "x-ratelimit-reset": "1",
    }
    assert [s.limit_remaining for s in named.statuses] == [3, 2**32 - 1, 0]
    assert not named.statuses[1].HasField("current_limit")
    assert not named.statuses[2].HasField("current_limit")
    # Nothing limited: no headers at all.
    assert list((await svc.call(request("api", [("x", "y")]))).response_headers_to_add) == []
    off = service_settings(local_cache, headers_enabled=False)
    async with serve_app(config, redis_url=redis.url, settings=off) as quiet:
        resp = await quiet.call(request("api", [("banned", "b")]))
        assert resp.overall_code == OVER and list(resp.response_headers_to_add) == []


async def test_replaces_and_unlimited(svc: Harness) -> None:
    assert (await svc.call(request("api", [("banned", "b")]))).overall_code == OVER
    pair = request("api", [("banned", "b")], [("override", "o")])
    results = [statuses(await svc.call(pair)) for _ in range(3)]
    assert results == [[(OK, 0), (OK, 1)], [(OK, 0), (OK, 0)], [(OK, 0), (OVER, 0)]]


async def test_unknown_domain_answers_ok_without_limit_and_is_counted(svc: Harness) -> None:
    before = metric_value("meshplane_ratelimit_unknown_domain_total", "")
    resp = await svc.call(request("nope", [("hello", "world")]))
    assert resp.overall_code == OK
    assert statuses(resp) == [(OK, 0)] and not resp.statuses[0].HasField("current_limit")
    assert list(resp.response_headers_to_add) == []
    assert metric_value("meshplane_ratelimit_unknown_domain_total", "") == before + 1


@pytest.mark.parametrize(
    ("req", "message"),
    [
        (request("", [("a", "b")]), "rate limit domain must not be empty"),
        (request("api"), "rate limit descriptor list must not be empty"),
        (request("api", [("", "b")]), "descriptors[0].entries[0] has an empty key"),
        (
            request("api", [("a", "b")], [("client", "")]),
            "descriptors[1].entries[0] (key 'client') has an empty value",
        ),
        (request("api", descriptor()), "descriptors[0] has no entries"),
    ],
)
async def test_invalid_input(svc: Harness, req, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await svc.call(req)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == message


async def test_bytes_that_are_not_a_request_are_invalid(svc: Harness) -> None:
    """The service plans from the wire bytes; bytes that do not parse as a
    RateLimitRequest are refused with a clear message, never half-decided."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{svc.port}") as channel:
        raw = raw_unary_aio(channel, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await raw(b"\x0a\xff\xff", timeout=5)  # a length running past the end
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "the request is not a valid RateLimitRequest"


async def test_every_key_has_a_ttl_ending_with_its_window(svc: Harness, redis: RedisServer) -> None:
    """Each key lives exactly until its window ends: not longer (it would
    outlive its window) and not shorter (it would refill early), so the TTL is
    pinned from both sides, the lower bound allowing only the real time spent
    since the keys were written (the service's clock stands still at T0)."""
    # (Rules with minute and hour windows: a 1-second key could expire, in real
    # time, before the scan reads it.)
    written = time.monotonic()
    await svc.call(request("api", [("client", "ivy")], [("route", "checkout")]))
    await svc.call(request("api", [("shadow", "s")], hits=2))
    await svc.call(request("api", [("override", "o")]))
    await svc.call(request("api", [("five_min", "f")]))
    keys = redis.command("--scan").split()
    assert len(keys) == 5
    windows = set()
    for key in keys:
        match = re.search(r"\}:(\d+):(\d+):", key)
        assert match, key
        window, start = int(match[1]), int(match[2])
        windows.add(window)
        ttl_ms = int(redis.command("pttl", key))
        elapsed_ms = (time.monotonic() - written) * 1000
        expected_ms = (start + window - T0) * 1000
        assert expected_ms - elapsed_ms - 1 <= ttl_ms <= expected_ms, (key, ttl_ms, expected_ms)
        assert key.startswith("rl:{")
    assert windows == {60, 300, 3600}


async def test_multi_unit_window_headers_and_reset_across_its_edge(
    svc: Harness, clock: FakeClock
) -> None:
    """A 30-second window (unit second, unit_multiplier 30) is aligned to
    multiples of 30 s: T0 is 10 s into one, so it resets in 20 s, and the
    headers name the real window, not the unit."""
    thirty = request("api", [("thirty", "t")])
    for expected in (4, 3, 2, 1, 0):
        resp = await svc.call(thirty)
        assert statuses(resp) == [(OK, expected)]
    assert headers_of(resp) == {
        "x-ratelimit-limit": "5, 5;w=30",
        "x-ratelimit-remaining": "0",
        "x-ratelimit-reset": "20",
    }
    assert resp.statuses[0].duration_until_reset.seconds == 20
    clock.advance(19.9)
    denied = await svc.call(thirty)
    assert denied.overall_code == OVER
    assert headers_of(denied)["x-ratelimit-reset"] == "1"
    clock.advance(0.2)  # the 30-second window turned: full again, a whole window to go
    resp = await svc.call(thirty)
    assert statuses(resp) == [(OK, 4)]
    assert headers_of(resp)["x-ratelimit-reset"] == "30"
    # Five minutes: T0 is 10 s into a 300-second window.
    both = await svc.call(request("api", [("five_min", "m")], [("client", "m")]))
    assert headers_of(both) == {
        "x-ratelimit-limit": "2, 2;w=300, 5;w=60",
        "x-ratelimit-remaining": "1",
        "x-ratelimit-reset": "270",
    }


@pytest.mark.parametrize("local_cache", [True], ids=["local-cache"])
async def test_over_limit_traffic_from_the_local_cache_costs_no_redis_command(
    svc: Harness, redis: RedisServer
) -> None:
    for _ in range(5):
        assert (await svc.call(request("api", [("client", "jo")]))).overall_code == OK
    calls = _evalsha_calls(redis)
    hits_before = metric_value("meshplane_ratelimit_local_cache_hits_total", "")
    for _ in range(20):
        resp = await svc.call(request("api", [("client", "jo")]))
        assert resp.overall_code == OVER
        assert headers_of(resp)["x-ratelimit-remaining"] == "0"
    assert _evalsha_calls(redis) == calls
    assert metric_value("meshplane_ratelimit_local_cache_hits_total", "") == hits_before + 20


def _evalsha_calls(redis: RedisServer) -> int:
    stats = redis.command("info", "commandstats")
    match = re.search(r"cmdstat_evalsha:calls=(\d+)", stats)
    eval_match = re.search(r"cmdstat_eval:calls=(\d+)", stats)
    return (int(match[1]) if match else 0) + (int(eval_match[1]) if eval_match else 0)


async def test_concurrent_decisions_share_round_trips(
    config: Path, redis: RedisServer, clock: FakeClock
) -> None:
    settings = Settings(store_timeout=2.0, redis_pipeline_window=0.002)
    async with serve_app(config, redis_url=redis.url, settings=settings, clock=clock) as svc:
        await _concurrent_calls(svc)


async def _concurrent_calls(svc: Harness) -> None:
    trips = metric_value("meshplane_ratelimit_redis_round_trips_total", "")
    decisions = metric_value("meshplane_ratelimit_redis_decisions_total", "")
    reqs = [request("api", [("client", f"p{i}")]) for i in range(200)]
    responses = await asyncio.gather(*(svc.call(r) for r in reqs))
    assert all(r.overall_code == OK for r in responses)
    sent = metric_value("meshplane_ratelimit_redis_decisions_total", "") - decisions
    written = metric_value("meshplane_ratelimit_redis_round_trips_total", "") - trips
    assert sent == 200
    # Script calls queued while others were out went to Redis together.
    assert written < sent


async def test_sliding_window_weighs_the_previous_window_in(
    svc: Harness, clock: FakeClock, redis: RedisServer
) -> None:
    """4 a minute, sliding: the previous minute's count weighs in by the part
    of it the last 60 s still cover (rounded up), so the turn of the minute
    frees nothing at once; remaining is what the next request may take, and
    the reset is when the bucket is full again: the end of the next minute."""
    sliding = request("api", [("sliding", "s")])
    for expected in (3, 2, 1, 0):
        resp = await svc.call(sliding)
        assert statuses(resp) == [(OK, expected)]
    assert headers_of(resp) == {
        "x-ratelimit-limit": "4, 4;w=60",
        "x-ratelimit-remaining": "0",
        "x-ratelimit-reset": "110",
    }
    [key] = [k for k in redis.command("--scan").split() if ":60s:" in k]
    # The counter outlives its minute: it is the next minute's previous count.
    assert 109_000 <= int(redis.command("pttl", key)) <= 110_000
    clock.advance(50)  # the minute turned: the previous 4 still weigh 4
    assert statuses(await svc.call(sliding)) == [(OVER, 0)]
    clock.advance(15)  # a quarter in: ceil(4 * 3/4) = 3 seen, one more fits
    assert statuses(await svc.call(sliding)) == [(OK, 0)]
    assert statuses(await svc.call(sliding)) == [(OVER, 0)]
    clock.advance(15)  # halfway: ceil(4 * 1/2) + 1 = 3 seen, one more fits
    resp = await svc.call(sliding)
    assert statuses(resp) == [(OK, 0)]
    assert headers_of(resp)["x-ratelimit-reset"] == "90"
