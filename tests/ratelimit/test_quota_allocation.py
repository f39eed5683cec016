"""The quota allocation rules (ratelimit/quota/allocation.py), table by table.

Pure functions with the clock as an argument: no server, no Envoy. What a real
gateway does with these assignments is tests/gateway/test_quota_gateways.py.
"""

from __future__ import annotations

import math

import pytest

from ratelimit.quota import allocation
from ratelimit.quota.allocation import TokenBucket, Usage


@pytest.mark.parametrize(
    ("previous", "requests", "elapsed", "expected"),
    [
        (None, 1, 0.0, 1.0),  # the first report: taken as it is
        (None, 50, 5.0, 10.0),
        (10.0, 100, 5.0, 15.0),  # half the new rate, half the old
        (20.0, 0, 5.0, 10.0),  # a quiet report halves the demand
    ],
)
def test_smoothed_demand(
    previous: float | None, requests: int, elapsed: float, expected: float
) -> None:
    assert allocation.smoothed_demand(previous, requests, elapsed) == pytest.approx(expected)


def test_active_drops_gateways_not_heard_within_stale_after() -> None:
    usage = {"a": Usage(5.0, 100.0), "b": Usage(7.0, 84.0), "c": Usage(1.0, 85.0)}
    assert allocation.active(usage, now=100.0, stale_after=15.0) == {"a": 5.0, "c": 1.0}


SHARES = [
    # limit, demands, expected shares
    (60.0, {"a": 80.0, "b": 10.0, "c": 10.0}, {"a": 40.0, "b": 10.0, "c": 10.0}),  # skewed
    (60.0, {"a": 30.0, "b": 30.0}, {"a": 30.0, "b": 30.0}),  # demand = limit
    (60.0, {"a": 100.0, "b": 100.0, "c": 100.0}, {"a": 20.0, "b": 20.0, "c": 20.0}),
    (60.0, {"a": 10.0, "b": 20.0}, {"a": 25.0, "b": 35.0}),  # headroom split equally
    (60.0, {"a": 0.0, "b": 500.0}, {"a": 3.0, "b": 57.0}),  # a quiet gateway keeps the floor
    (60.0, {"a": 1.0}, {"a": 60.0}),  # alone: the whole limit
    (60.0, {}, {}),
    (0.0, {"a": 5.0}, {"a": 0.0}),
]


@pytest.mark.parametrize(("limit", "demands", "expected"), SHARES)
def test_shares(limit: float, demands: dict[str, float], expected: dict[str, float]) -> None:
    got = allocation.shares(limit, demands)
    assert got == pytest.approx(expected)
    if demands and limit > 0:
        assert math.fsum(got.values()) == pytest.approx(limit)  # never more than the limit


@pytest.mark.parametrize("seed", range(20))
def test_shares_sum_to_the_limit_and_nobody_with_demand_starves(seed: int) -> None:
    import random

    rng = random.Random(seed)
    limit = rng.uniform(1, 1000)
    demands = {str(i): rng.choice([0.0, rng.uniform(0, 2000)]) for i in range(rng.randint(1, 9))}
    got = allocation.shares(limit, demands)
    assert math.fsum(got.values()) == pytest.approx(limit)
    floor = allocation.FLOOR_FRACTION * limit / len(demands)
    for member, demand in demands.items():
        assert got[member] >= min(demand, floor) - 1e-9


TOKEN_BUCKETS = [
    # share, expected bucket
    (250.0, TokenBucket(max_tokens=125, tokens_per_fill=250, fill_interval=1)),
    (40.0, TokenBucket(max_tokens=20, tokens_per_fill=400, fill_interval=10)),
    (4.36, TokenBucket(max_tokens=2, tokens_per_fill=43, fill_interval=10)),  # rounded down
    (1.0, TokenBucket(max_tokens=1, tokens_per_fill=10, fill_interval=10)),
    (0.3, TokenBucket(max_tokens=1, tokens_per_fill=10, fill_interval=34)),  # 0.294/s <= 0.3
    (0.01, TokenBucket(max_tokens=1, tokens_per_fill=1, fill_interval=60)),  # capped interval
    (0.0, TokenBucket(max_tokens=1, tokens_per_fill=1, fill_interval=60)),
]


@pytest.mark.parametrize(("share", "expected"), TOKEN_BUCKETS)
def test_token_bucket(share: float, expected: TokenBucket) -> None:
    bucket = allocation.token_bucket(share)
    assert bucket == expected
    if share >= 1 / allocation.MAX_FILL_INTERVAL:
        assert bucket.rate <= share + 1e-9
    if share >= 1:  # rounding costs at most a tenth of a token a second
        assert share - bucket.rate <= 0.1 + 1e-9


UPDATES = [
    # current, wanted, replace?
    (None, TokenBucket(5, 10, 1), True),
    (TokenBucket(5, 10, 1), TokenBucket(5, 10, 1), False),
    (TokenBucket(5, 10, 1), TokenBucket(4, 9, 1), True),  # shrinks at once
    (TokenBucket(5, 10, 1), TokenBucket(5, 11, 1), False),  # grows by 10%: not worth a burst
    (TokenBucket(5, 10, 1), TokenBucket(6, 12, 1), True),  # grows by 20%
]


@pytest.mark.parametrize(("current", "wanted", "expected"), UPDATES)
def test_needs_update(current: TokenBucket | None, wanted: TokenBucket, expected: bool) -> None:
    assert allocation.needs_update(current, wanted) is expected


@pytest.mark.parametrize(
    ("limit", "gateways", "interval", "expected"),
    [(60.0, 3, 5.0, 6.0), (1000.0, 10, 5.0, 100.0), (2.0, 3, 5.0, 0.6)],
)
def test_over_admission_bound(
    limit: float, gateways: int, interval: float, expected: float
) -> None:
    assert allocation.over_admission_bound(limit, gateways, interval) == pytest.approx(expected)
