"""Per-rule hit counters, named and counted as envoyproxy/ratelimit counts them.

The reference adds every allowed hit to ``within_limit`` and the hits above
``floor(limit * nearLimitRatio)`` to ``near_limit`` as well (a subset, not a
split); ``over_limit`` gets the hits a rule could not cover. Here a denied
request consumes nothing (docs/ratelimit.md), so its hits are only over_limit.
"""

from __future__ import annotations

from pathlib import Path

from envoy.service.ratelimit.v3 import rls_pb2

from ratelimit.config import load_config
from ratelimit.service import RateLimitService
from ratelimit.settings import Settings
from ratelimit.store.memory import MemoryStore
from tests.ratelimit.conftest import T0, descriptor, metric_value, request, write_config

CONFIG = """\
domain: metrics
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
"""

LABELS = 'domain="metrics",rule="user"'


def _value(kind: str) -> float:
    return metric_value(f"meshplane_ratelimit_{kind}_total", LABELS)


async def test_within_limit_counts_every_allowed_hit_and_near_limit_is_a_subset(
    tmp_path: Path,
) -> None:
    config = load_config(write_config(tmp_path, "metrics.yaml", CONFIG))
    service = RateLimitService(lambda: config, MemoryStore(), Settings(), clock=lambda: T0)
    before = {
        kind: _value(kind) for kind in ("total_hits", "within_limit", "near_limit", "over_limit")
    }
    # Costs 6, 3, 2: the first two consume 9 of 10 (hits 9 is above floor(10*0.8)=8,
    # so 1 near-limit hit); the third (cost 2) does not fit and is denied whole.
    codes = []
    for cost in (6, 3, 2):
        raw = request("metrics", descriptor(("user", "u1"), hits=cost)).SerializeToString()
        response = rls_pb2.RateLimitResponse.FromString(await service.decide(raw))
        codes.append(response.overall_code)
    assert codes == [rls_pb2.RateLimitResponse.OK] * 2 + [rls_pb2.RateLimitResponse.OVER_LIMIT]
    delta = {kind: _value(kind) - value for kind, value in before.items()}
    assert delta == {"total_hits": 11, "within_limit": 9, "near_limit": 1, "over_limit": 2}
    await service.close()
