"""Pure request planning: a serialized RateLimitRequest + config + clock → the buckets to decide.

This is everything between the wire and the store: validating the request,
matching each descriptor, applying ``replaces``, working out each
descriptor's cost and merging descriptors that land on the same counter into
one bucket (so the store sees distinct keys and the cost is charged once,
summed). No I/O; ``now`` is passed in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2
from google.protobuf.message import DecodeError

from ratelimit.buckets import Bucket, bucket_key, window_at
from ratelimit.config import DomainConfig, RateLimit, RateLimitConfig
from ratelimit.matching import Match, match_descriptor
from ratelimit.units import UNIT_BY_PROTO, WINDOW_SECONDS


class InvalidRequest(ValueError):
    """The request is malformed; the message is sent back as INVALID_ARGUMENT."""


class DescriptorPlan(NamedTuple):
    """How one request descriptor is answered.

    ``limit`` is None when nothing applies (unknown domain, no match,
    allow-listed, replaced); ``bucket`` indexes ``Plan.buckets`` for limited
    descriptors.
    """

    limit: RateLimit | None
    bucket: int | None
    cost: int


class Plan(NamedTuple):
    domain: str
    domain_known: bool
    descriptors: tuple[DescriptorPlan, ...]
    buckets: tuple[Bucket, ...]


def _entries(
    index: int, descriptor: ratelimit_pb2.RateLimitDescriptor
) -> tuple[tuple[str, str], ...]:
    """The descriptor's (key, value) pairs; empty keys or values are rejected."""
    entries = tuple([(e.key, e.value) for e in descriptor.entries])
    if not entries:
        raise InvalidRequest(f"descriptors[{index}] has no entries")
    for key, value in entries:
        if not key or not value:
            _reject(index, entries)
    return entries


def _reject(index: int, entries: Sequence[tuple[str, str]]) -> None:
    for j, (key, value) in enumerate(entries):
        if not key:
            raise InvalidRequest(f"descriptors[{index}].entries[{j}] has an empty key")
        if not value:
            raise InvalidRequest(
                f"descriptors[{index}].entries[{j}] (key {key!r}) has an empty value"
            )


def _override(domain: str, descriptor: ratelimit_pb2.RateLimitDescriptor) -> Match | None:
    # A limit sent by Envoy (RateLimitOverride) replaces the config, as in the reference.
    unit = UNIT_BY_PROTO.get(descriptor.limit.unit)
    if unit is None:
        return None
    entries = tuple((e.key, e.value) for e in descriptor.entries)
    limit = RateLimit(
        requests_per_unit=descriptor.limit.requests_per_unit,
        unit=unit,
        window_seconds=WINDOW_SECONDS[unit],
        name=None,
        unlimited=False,
        replaces=frozenset(),
        shadow_mode=False,
        domain=domain,
        rule_id="override:" + ".".join(k for k, _ in entries),
    )
    return Match(limit, entries)


class _PlanCache:
    """Plans of recently seen requests, for one config snapshot.

    A plan depends on the config, on the request's content and on ``now``
    only through its buckets' windows. The same few requests repeat, so a
    plan is kept under the request's bytes as they came off the wire (equal
    bytes, equal request; a hit parses nothing) and reused for as long as
    ``now`` stays inside every one of its windows: validation, matching and
    key hashing are done once per window.
    A new snapshot (reload) starts an empty cache; the size is bounded
    because the requests carry client values. Unknown domains are not cached.
    """

    MAX_ENTRIES = 65536

    def __init__(self) -> None:
        self.config: RateLimitConfig | None = None
        self.key_prefix = ""
        self.plans: dict[bytes, tuple[float, float, Plan]] = {}

    def plans_for(
        self, config: RateLimitConfig, key_prefix: str
    ) -> dict[bytes, tuple[float, float, Plan]]:
        if config is not self.config or key_prefix != self.key_prefix:
            self.config = config
            self.key_prefix = key_prefix
            self.plans.clear()
        elif len(self.plans) >= self.MAX_ENTRIES:
            self.plans.clear()
        return self.plans


_plan_cache = _PlanCache()


def plan_request(
    config: RateLimitConfig,
    raw_request: bytes,
    now: float,
    *,
    key_prefix: str = "rl:",
) -> Plan:
    """Validate and plan a serialized RateLimitRequest; raises InvalidRequest."""
    plans = _plan_cache.plans_for(config, key_prefix)
    cached = plans.get(raw_request)
    if cached is not None and cached[0] <= now < cached[1]:
        return cached[2]
    try:
        request = rls_pb2.RateLimitRequest.FromString(raw_request)
    except DecodeError:
        raise InvalidRequest("the request is not a valid RateLimitRequest") from None
    domain = request.domain
    if not domain:
        raise InvalidRequest("rate limit domain must not be empty")
    descriptors = request.descriptors
    if not descriptors:
        raise InvalidRequest("rate limit descriptor list must not be empty")
    request_cost = request.hits_addend or 1
    shape = [
        (_entries(i, d), d.hits_addend.value if d.HasField("hits_addend") else request_cost)
        for i, d in enumerate(descriptors)
    ]
    domain_cfg = config.domains.get(domain)
    if domain_cfg is None:
        return Plan(domain, False, tuple(DescriptorPlan(None, None, c) for _, c in shape), ())
    plan = _plan(domain, domain_cfg, descriptors, shape, now=now, key_prefix=key_prefix)
    valid_from = max((b.window.start for b in plan.buckets), default=-math.inf)
    valid_until = min((b.window.end for b in plan.buckets), default=math.inf)
    plans[raw_request] = (valid_from, valid_until, plan)
    return plan


def _plan(
    domain: str,
    domain_cfg: DomainConfig,
    descriptors: Sequence[ratelimit_pb2.RateLimitDescriptor],
    shape: Sequence[tuple[tuple[tuple[str, str], ...], int]],
    *,
    now: float,
    key_prefix: str,
) -> Plan:
    matches: list[Match | None] = []
    for d, (entries, _) in zip(descriptors, shape, strict=True):
        if d.HasField("limit"):
            matches.append(_override(domain, d))
        else:
            matches.append(match_descriptor(domain_cfg, entries))
    replaced = {name for m in matches if m is not None for name in m.limit.replaces}
    if replaced:
        matches = [None if m is not None and m.limit.name in replaced else m for m in matches]
    return _assemble(domain, matches, [c for _, c in shape], now, key_prefix)


def _assemble(
    domain: str,
    matches: Sequence[Match | None],
    costs: Sequence[int],
    now: float,
    key_prefix: str,
) -> Plan:
    index_of: dict[str, int] = {}
    merged: list[Bucket] = []
    plans: list[DescriptorPlan] = []
    for match, cost in zip(matches, costs, strict=True):
        if match is None:
            plans.append(DescriptorPlan(None, None, cost))
            continue
        limit = match.limit
        if limit.unlimited:
            plans.append(DescriptorPlan(limit, None, cost))
            continue
        window = window_at(limit.window_seconds, now)
        key = bucket_key(key_prefix, domain, match.bucket_path, window)
        existing = index_of.get(key)
        if existing is None:
            index_of[key] = len(merged)
            merged.append(Bucket(key, limit.requests_per_unit, cost, window, limit.shadow_mode))
            plans.append(DescriptorPlan(limit, len(merged) - 1, cost))
        else:
            old = merged[existing]
            # Same counter twice: charge the sum once; it denies unless every use is shadow.
            merged[existing] = Bucket(
                key,
                min(old.limit, limit.requests_per_unit),
                old.cost + cost,
                window,
                old.shadow and limit.shadow_mode,
            )
            plans.append(DescriptorPlan(limit, existing, cost))
    return Plan(domain, True, tuple(plans), tuple(merged))
