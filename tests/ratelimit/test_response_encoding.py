"""encode_response writes the protobuf wire format by hand (it is on the hot
path); it must give exactly the message that setting each field through the
protobuf API gives."""

from __future__ import annotations

import random

from envoy.service.ratelimit.v3 import rls_pb2

from ratelimit.buckets import Bucket, window_at
from ratelimit.config import RateLimit
from ratelimit.headers import HeaderNames, LimitView, render
from ratelimit.plan import DescriptorPlan, Plan
from ratelimit.response import encode_response
from ratelimit.store import Outcome
from ratelimit.units import WINDOW_SECONDS

_Response = rls_pb2.RateLimitResponse


def reference(
    plan: Plan, outcome: Outcome | None, now: float, headers: HeaderNames | None
) -> rls_pb2.RateLimitResponse:
    """The response built field by field (the implementation before the encoder)."""
    response = _Response(overall_code=_Response.OK)
    views: list[LimitView] = []
    remaining = outcome.remaining(plan.buckets) if outcome is not None else ()
    for desc in plan.descriptors:
        status = response.statuses.add()
        status.code = _Response.OK
        limit = desc.limit
        if limit is None:
            continue
        if desc.bucket is None:
            status.limit_remaining = 2**32 - 1
            continue
        assert outcome is not None
        bucket = plan.buckets[desc.bucket]
        if not outcome.fits[desc.bucket] and not limit.shadow_mode:
            status.code = _Response.OVER_LIMIT
        current = status.current_limit
        current.requests_per_unit = limit.requests_per_unit
        current.unit = limit.proto_unit
        if limit.name:
            current.name = limit.name
        status.limit_remaining = remaining[desc.bucket]
        reset = bucket.window.reset_after(now)
        status.duration_until_reset.seconds = reset
        views.append(
            LimitView(
                limit.requests_per_unit,
                limit.window_seconds,
                remaining[desc.bucket],
                reset,
                limit.name,
            )
        )
    if outcome is not None and not outcome.allowed:
        response.overall_code = _Response.OVER_LIMIT
    if headers is not None:
        over = response.overall_code == _Response.OVER_LIMIT
        for name, value in render(views, over_limit=over, names=headers):
            response.response_headers_to_add.add(key=name, value=value)
    return response


def random_case(rng: random.Random) -> tuple[Plan, Outcome | None, float]:
    now = rng.choice([1_800_000_010.0, 1_800_000_059.999, 1_700_000_000.25])
    descriptors: list[DescriptorPlan] = []
    buckets: list[Bucket] = []
    for _ in range(rng.randint(1, 4)):
        kind = rng.random()
        cost = rng.choice([0, 1, 1, 5, 300])
        if kind < 0.15:
            descriptors.append(DescriptorPlan(None, None, cost))
            continue
        unit = rng.choice(list(WINDOW_SECONDS))
        limit = RateLimit(
            requests_per_unit=rng.choice([0, 1, 100, 127, 128, 16384, 4_000_000_000, 2**32 - 1]),
            unit=unit,
            window_seconds=WINDOW_SECONDS[unit],
            name=rng.choice([None, "", "per_client", "naïve-名前"]),
            unlimited=kind < 0.25,
            replaces=frozenset(),
            shadow_mode=rng.random() < 0.3,
            domain="d",
            rule_id="r",
        )
        if limit.unlimited:
            descriptors.append(DescriptorPlan(limit, None, cost))
            continue
        if buckets and rng.random() < 0.2:  # the same bucket twice
            descriptors.append(DescriptorPlan(limit, rng.randrange(len(buckets)), cost))
            continue
        window = window_at(limit.window_seconds, now)
        buckets.append(
            Bucket(f"k{len(buckets)}", limit.requests_per_unit, cost, window, limit.shadow_mode)
        )
        descriptors.append(DescriptorPlan(limit, len(buckets) - 1, cost))
    plan = Plan("d", True, tuple(descriptors), tuple(buckets), {})
    if not buckets:
        return plan, None, now
    counts = tuple(rng.choice([0, 1, 99, 200, 2**32 - 1]) for _ in buckets)
    fits = tuple(rng.random() < 0.7 for _ in buckets)
    return plan, Outcome(rng.random() < 0.6, counts, fits), now


def test_encoded_response_equals_the_field_by_field_one() -> None:
    rng = random.Random(7)
    custom = HeaderNames("x-rl-limit", "x-rl-remaining", "x-rl-reset", "x-limited")
    for _ in range(3000):
        plan, outcome, now = random_case(rng)
        for names in (HeaderNames(), custom, None):
            got = rls_pb2.RateLimitResponse.FromString(
                encode_response(plan, outcome, now, headers=names)
            )
            want = reference(plan, outcome, now, names)
            assert got == want, (plan, outcome, names)
            assert got.SerializeToString(deterministic=True) == want.SerializeToString(
                deterministic=True
            )
            for got_status, want_status in zip(got.statuses, want.statuses, strict=True):
                assert got_status.HasField("current_limit") == want_status.HasField("current_limit")
                assert got_status.HasField("duration_until_reset") == want_status.HasField(
                    "duration_until_reset"
                )


def test_varints_match_protobuf() -> None:
    from ratelimit.response import _varint

    for value in [*range(300), 16383, 16384, 2**21 - 1, 2**21, 2**28, 2**32 - 1]:
        encoded = _Response.DescriptorStatus(limit_remaining=value).SerializeToString()
        assert (b"\x18" + _varint(value) if value else b"") == encoded, value


def test_one_plan_answered_across_its_window() -> None:
    """The encoder keeps what depends on the clock for a whole second: the
    same plan, answered at many instants, must still equal the reference."""
    rng = random.Random(11)
    for _ in range(200):
        plan, outcome, now = random_case(rng)
        start = int(now)
        for offset in (0.0, 0.25, 0.999, 1.0, 1.5, 7.0, 59.999, 61.0, 3599.5):
            at = start + offset
            if any(not b.window.start <= at < b.window.end for b in plan.buckets):
                continue  # a cached plan is only used inside its windows
            got = rls_pb2.RateLimitResponse.FromString(
                encode_response(plan, outcome, at, headers=HeaderNames())
            )
            assert got == reference(plan, outcome, at, HeaderNames()), (plan, at)
