"""Both stores against a reference model, for both algorithms (hypothesis).

Random arrivals (times and costs) are planned from a real config and decided
by the memory store and by a real redis-server, with an injected clock; a
plain model written from the definitions in docs/ratelimit.md decides the
same arrivals. Every decision and remaining count must agree, and over the
admitted arrivals:

- fixed window: no aligned window admits more than the limit (exactly);
- sliding window: no interval of the window's length admits more than the
  documented bound, ``limit + N * b / L``, where ``b`` is how far the
  interval's end lies into its aligned window and ``N`` what the aligned
  window before admitted (so always less than twice the limit, and exactly the
  limit for an interval that is itself an aligned window).

Arrival times are whole seconds (boundaries included: one in ten is on one)
plus 0 or 1 ms. The service's clock is injected, Redis's is real: a fixed
window's key lives ``end - now`` of Redis's time, so an arrival 1 ms before a
window's end would leave a key that Redis may expire before the next arrival
of that window is decided; whole seconds leave it at least a second.
"""

from __future__ import annotations

import asyncio
import math
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratelimit.config import RateLimitConfig, parse_domain
from ratelimit.plan import plan_request
from ratelimit.redis_url import parse_redis_url
from ratelimit.store import CounterStore
from ratelimit.store.memory import MemoryStore
from ratelimit.store.redis import RedisStore
from ratelimit.store.resp import build_keyed_client
from tests.ratelimit.conftest import descriptor, request
from tests.support.redis_server import RedisServer

WINDOW = 10  # unit: second, unit_multiplier: 10
T0 = 1_800_000_000  # a window boundary

arrivals = st.lists(
    st.tuples(
        st.integers(0, 4 * WINDOW), st.sampled_from([0, 0.001]), st.sampled_from([1, 1, 1, 0, 2])
    ),
    min_size=1,
    max_size=40,
).map(sorted)


def _config(algorithm: str, limit: int) -> RateLimitConfig:
    text = (
        "domain: model\ndescriptors:\n  - key: k\n    rate_limit:\n"
        f"      unit: second\n      unit_multiplier: {WINDOW}\n"
        f"      requests_per_unit: {limit}\n      algorithm: {algorithm}\n"
    )
    return RateLimitConfig.of([parse_domain(text, "model.yaml")])


class Model:
    """The definitions, in exact arithmetic, over the arrivals admitted so far."""

    def __init__(self, limit: int, sliding: bool) -> None:
        self.limit, self.sliding = limit, sliding
        self.admitted: list[tuple[Fraction, int]] = []  # (time, cost)

    def _charged(self, start: int) -> int:
        return sum(c for t, c in self.admitted if start <= t < start + WINDOW)

    def seen(self, now: Fraction) -> int:
        start = math.floor(now / WINDOW) * WINDOW
        count = self._charged(start)
        if self.sliding:
            left = Fraction(start + WINDOW) - now
            count += math.ceil(self._charged(start - WINDOW) * left / WINDOW)
        return count

    def decide(self, now: Fraction, cost: int) -> tuple[bool, int]:
        seen = self.seen(now)
        if self.limit - seen < max(cost, 1):
            return False, max(0, self.limit - seen)
        if cost:
            self.admitted.append((now, cost))
        return True, max(0, self.limit - seen - cost)


def _check_bound(model: Model) -> None:
    limit = model.limit
    for end, _ in model.admitted:
        inside = sum(c for t, c in model.admitted if end - WINDOW <= t <= end)
        start = math.floor(end / WINDOW) * WINDOW
        if not model.sliding:
            assert model._charged(start) <= limit
            continue
        before = model._charged(start - WINDOW)
        assert inside <= limit + before * (end - start) / WINDOW, (end, inside)
        assert inside < 2 * limit or limit == 0


async def _run(
    store: CounterStore, config: RateLimitConfig, times: list[tuple[int, float, int]]
) -> list[tuple[bool, int]]:
    decisions = []
    for seconds, extra, cost in times:
        now = T0 + seconds + extra
        raw = request("model", descriptor(("k", "v"), hits=cost)).SerializeToString()
        plan = plan_request(config, raw, now, key_prefix="model:")
        outcome = await store.apply(plan.buckets, now)
        decisions.append((outcome.allowed, outcome.remaining(plan.buckets)[0]))
    await store.close()
    return decisions


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window"])
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(limit=st.integers(1, 5), times=arrivals)
def test_both_stores_follow_the_model(
    redis_module: RedisServer, algorithm: str, limit: int, times: list[tuple[int, float, int]]
) -> None:
    config = _config(algorithm, limit)
    model = Model(limit, algorithm == "sliding_window")
    expected = [
        model.decide(T0 + seconds + Fraction(round(extra * 1000), 1000), cost)
        for seconds, extra, cost in times
    ]
    _check_bound(model)
    assert asyncio.run(_run(MemoryStore(), config, times)) == expected
    redis_module.command("flushall")
    client = build_keyed_client(parse_redis_url(redis_module.url), connect_timeout=5)
    assert asyncio.run(_run(RedisStore(client, timeout=5), config, times)) == expected
