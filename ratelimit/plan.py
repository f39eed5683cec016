"""Pure request planning: a serialized RateLimitRequest + config + clock → the buckets to decide.

This is everything between the wire and the store: validating the request,
matching each descriptor, applying ``replaces``, working out each
descriptor's cost and merging descriptors that land on the same counter into
one bucket (so the store sees distinct keys and the cost is charged once,
summed). No I/O; ``now`` is passed in.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, NamedTuple

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
    #: The metric label of a ``detailed_metric`` or ``value_to_metric`` limit:
    #: the reference's stats key with the request's values
    #: (``key_value.key2_value2``); else None.
    detail: str | None = None


class Plan(NamedTuple):
    """A planned request. ``memo`` holds what later layers derive from the
    plan alone (the response template, the metric rows): it lives and dies
    with the plan, so the plan cache's byte bound covers it too."""

    domain: str
    domain_known: bool
    descriptors: tuple[DescriptorPlan, ...]
    buckets: tuple[Bucket, ...]
    memo: dict[object, Any]


class PlanBounds(NamedTuple):
    """What one request may carry, and what the cache of plans may hold.

    The request caps are checked when a request is planned (a cached plan's
    bytes passed them already, so a hit checks nothing); above them the
    request is refused with INVALID_ARGUMENT. They bound the work and memory
    of one request: its plan, its response, and its script in Redis (whose
    run time grows with the buckets; every other decision waits behind it).
    The cache is bounded in bytes, and an entry bigger than
    ``cache_entry_bytes`` is not cached at all (served, then dropped).
    Defaults and reasons: docs/ratelimit.md, "Request caps".
    """

    max_descriptors: int = 256
    max_entries: int = 32
    max_value_bytes: int = 65536  # a domain, key or value, in UTF-8
    cache_bytes: int = 32 << 20
    cache_entry_bytes: int = 16 << 10


def _entries(
    index: int, descriptor: ratelimit_pb2.RateLimitDescriptor, bounds: PlanBounds
) -> tuple[tuple[str, str], ...]:
    """The descriptor's (key, value) pairs; empty, too many or too long ones are rejected."""
    count = len(descriptor.entries)
    if count > bounds.max_entries:
        raise InvalidRequest(
            f"descriptors[{index}] has {count} entries; at most {bounds.max_entries} are allowed"
        )
    entries = tuple([(e.key, e.value) for e in descriptor.entries])
    if not entries:
        raise InvalidRequest(f"descriptors[{index}] has no entries")
    # A character is at most 4 UTF-8 bytes: shorter strings need no encoding to be checked.
    short = bounds.max_value_bytes // 4
    for key, value in entries:
        if not key or not value or len(key) > short or len(value) > short:
            _reject(index, entries, bounds.max_value_bytes)
    return entries


def _reject(index: int, entries: Sequence[tuple[str, str]], max_bytes: int) -> None:
    """Raise for the first bad entry, if any (a long one may still be within the cap)."""
    for j, (key, value) in enumerate(entries):
        where = f"descriptors[{index}].entries[{j}]"
        if not key:
            raise InvalidRequest(f"{where} has an empty key")
        if not value:
            raise InvalidRequest(f"{where} (key {key!r}) has an empty value")
        _check_length(f"{where} key", key, max_bytes)
        _check_length(f"{where} value", value, max_bytes)


#: The largest cost a descriptor's ``hits_addend`` may ask for: the largest
#: limit (``requests_per_unit`` is a uint32), which the request's own
#: ``hits_addend`` (a uint32) cannot exceed either. The field is a uint64; a
#: bigger cost could never be covered, and would lose precision in Redis's Lua.
MAX_COST = 2**32 - 1


def _cost(index: int, value: int) -> int:
    if value > MAX_COST:
        raise InvalidRequest(
            f"descriptors[{index}].hits_addend is {value}; at most {MAX_COST} is allowed"
        )
    return value


def _check_length(what: str, text: str, max_bytes: int) -> None:
    """Refuse a string longer than ``max_bytes`` in UTF-8, without quoting it."""
    if len(text) > max_bytes // 4 and len(text.encode()) > max_bytes:
        raise InvalidRequest(
            f"{what} is {len(text.encode())} bytes long; at most {max_bytes} are allowed"
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


class _Entry(NamedTuple):
    """A cached plan, the span of ``now`` it holds for, and what it is counted as."""

    valid_from: float
    valid_until: float
    plan: Plan
    size: int


# What a cached plan is counted as, beyond its request's bytes: the entry and
# the plan's fixed part, then per descriptor (its plan, status template and
# metric row) and per bucket (its key and window). Measured with tracemalloc
# and rounded up (bench/ratelimit/plan_cache_memory.py prints the real figure).
_ENTRY_BYTES = 1024
_DESCRIPTOR_BYTES = 700
_BUCKET_BYTES = 320


def _entry_size(raw_request: bytes, plan: Plan) -> int:
    return (
        _ENTRY_BYTES
        + len(raw_request)
        + _DESCRIPTOR_BYTES * len(plan.descriptors)
        + _BUCKET_BYTES * len(plan.buckets)
        + sum([len(d.detail) for d in plan.descriptors if d.detail is not None])
    )


class _PlanCache:
    """Plans of recently seen requests, for one config snapshot.

    A plan depends on the config, on the request's content and on ``now``
    only through its buckets' windows. The same few requests repeat, so a
    plan is kept under the request's bytes as they came off the wire (equal
    bytes, equal request; a hit parses nothing) and reused for as long as
    ``now`` stays inside every one of its windows: validation, matching and
    key hashing are done once per window.

    The requests carry client values, so the cache is bounded in bytes
    (``PlanBounds.cache_bytes``, the request's bytes plus an estimate of the
    plan and of what is derived from it) and drops the least recently used
    entry first, whether or not its windows have ended; a request too big to
    be worth caching is planned on every call. A new snapshot (reload) or new
    bounds start an empty cache. Unknown domains are not cached.
    """

    def __init__(self) -> None:
        self.config: RateLimitConfig | None = None
        self.key_prefix = ""
        self.quota_mode = False
        self.bounds = _DEFAULT_BOUNDS
        self.plans: OrderedDict[bytes, _Entry] = OrderedDict()
        self.size = 0  # the sum of the entries' sizes

    def plans_for(
        self, config: RateLimitConfig, key_prefix: str, bounds: PlanBounds, quota_mode: bool
    ) -> OrderedDict[bytes, _Entry]:
        if (
            config is not self.config
            or key_prefix != self.key_prefix
            or (bounds is not self.bounds and bounds != self.bounds)
            or quota_mode is not self.quota_mode
        ):
            self.config, self.key_prefix, self.bounds = config, key_prefix, bounds
            self.quota_mode = quota_mode
            self.plans.clear()
            self.size = 0
        return self.plans

    def add(self, raw_request: bytes, entry: _Entry) -> None:
        """Keep ``entry`` (unless it is too big), then drop the least recently
        used entries until the cache fits its budget again."""
        if entry.size > self.bounds.cache_entry_bytes:
            return
        plans = self.plans
        old = plans.pop(raw_request, None)
        if old is not None:
            self.size -= old.size
        plans[raw_request] = entry
        self.size += entry.size
        while self.size > self.bounds.cache_bytes and plans:
            self.size -= plans.popitem(last=False)[1].size


_DEFAULT_BOUNDS = PlanBounds()
_plan_cache = _PlanCache()


def plan_request(
    config: RateLimitConfig,
    raw_request: bytes,
    now: float,
    *,
    key_prefix: str = "rl:",
    bounds: PlanBounds = _DEFAULT_BOUNDS,
    quota_mode: bool = False,
) -> Plan:
    """Validate and plan a serialized RateLimitRequest; raises InvalidRequest.

    ``quota_mode`` is the global switch (the reference's ``QUOTA_MODE``):
    every descriptor is in quota mode, whatever its config says."""
    plans = _plan_cache.plans_for(config, key_prefix, bounds, quota_mode)
    cached = plans.get(raw_request)
    if cached is not None and cached[0] <= now < cached[1]:
        plans.move_to_end(raw_request)
        return cached[2]
    try:
        request = rls_pb2.RateLimitRequest.FromString(raw_request)
    except DecodeError:
        raise InvalidRequest("the request is not a valid RateLimitRequest") from None
    domain = request.domain
    if not domain:
        raise InvalidRequest("rate limit domain must not be empty")
    _check_length("the domain", domain, bounds.max_value_bytes)
    descriptors = request.descriptors
    if not descriptors:
        raise InvalidRequest("rate limit descriptor list must not be empty")
    if len(descriptors) > bounds.max_descriptors:
        raise InvalidRequest(
            f"the request has {len(descriptors)} descriptors;"
            f" at most {bounds.max_descriptors} are allowed"
        )
    # As the reference (utils.GetHitsAddends): a descriptor's own hits_addend
    # when set, 0 included ("check only"); else the request's, 0 meaning 1.
    request_cost = request.hits_addend or 1
    shape = [
        (
            _entries(i, d, bounds),
            _cost(i, d.hits_addend.value) if d.HasField("hits_addend") else request_cost,
        )
        for i, d in enumerate(descriptors)
    ]
    domain_cfg = config.domains.get(domain)
    if domain_cfg is None:
        return Plan(domain, False, tuple(DescriptorPlan(None, None, c) for _, c in shape), (), {})
    plan = _plan(
        domain, domain_cfg, descriptors, shape, now=now, key_prefix=key_prefix, quota=quota_mode
    )
    valid_from = max((b.window.start for b in plan.buckets), default=-math.inf)
    valid_until = min((b.window.end for b in plan.buckets), default=math.inf)
    _plan_cache.add(
        raw_request, _Entry(valid_from, valid_until, plan, _entry_size(raw_request, plan))
    )
    return plan


def _plan(
    domain: str,
    domain_cfg: DomainConfig,
    descriptors: Sequence[ratelimit_pb2.RateLimitDescriptor],
    shape: Sequence[tuple[tuple[tuple[str, str], ...], int]],
    *,
    now: float,
    key_prefix: str,
    quota: bool,
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
    plan = _assemble(domain, matches, [c for _, c in shape], now, key_prefix)
    if quota or any(b.quota for b in plan.buckets):
        return _quota_plan(plan, quota)
    return plan


def _quota_plan(plan: Plan, everything: bool) -> Plan:
    """The plan's buckets marked for quota mode (``everything``: the global switch).

    The reference (``shouldRateLimitWorker``) answers OVER_LIMIT when a
    non-quota descriptor is over its limit, or when the request has quota
    descriptors and every one of them is over. A quota descriptor that cannot
    be over always passes, which lets the request through whatever the other
    quota descriptors say: a shadow one (its status is OK), and, under the
    global switch, one that no limit applies to (unknown, allow-listed or
    replaced; the reference counts it as a quota descriptor that passed).
    Unlimited descriptors do not count. Then the quota buckets cannot deny:
    they are marked shadow, which the store reads as "never deny, charge
    only if it fits"; the statuses still come from each limit's own
    ``shadow_mode``, so a quota descriptor over its limit is reported
    OVER_LIMIT all the same.
    """
    free = False
    for desc in plan.descriptors:
        limit = desc.limit
        if limit is None:
            free = free or everything
        elif limit.unlimited:
            continue
        elif limit.shadow_mode and (everything or limit.quota_mode):
            free = True
    buckets = list(plan.buckets)
    if everything:
        buckets = [b._replace(quota=not b.shadow) for b in buckets]
    if free:
        buckets = [b._replace(shadow=True, quota=False) if b.quota else b for b in buckets]
    return plan._replace(buckets=tuple(buckets))


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
        detail = match.value_metric  # value_to_metric: None unless asked for
        if limit.detailed_metric:
            # The reference's detailed stats key: every entry as key_value, with
            # the request's value (a share_threshold entry: its pattern). It
            # takes precedence over value_to_metric, as there.
            detail = ".".join(f"{k}_{v}" for k, v in match.bucket_path)
        elif detail == limit.rule_id:
            detail = None  # the flag changed nothing: the rule's own series
        window = window_at(limit.window_seconds, now)
        sliding = limit.sliding
        key = bucket_key(key_prefix, domain, match.bucket_path, window, sliding=sliding)
        existing = index_of.get(key)
        if existing is None:
            index_of[key] = len(merged)
            prev_key = ""
            if sliding:
                prev = window._replace(start=window.start - window.seconds)
                prev_key = bucket_key(key_prefix, domain, match.bucket_path, prev, sliding=True)
            shadow = limit.shadow_mode
            merged.append(
                Bucket(
                    key,
                    limit.requests_per_unit,
                    cost,
                    window,
                    shadow,
                    prev_key,
                    quota=limit.quota_mode and not shadow,
                )
            )
            plans.append(DescriptorPlan(limit, len(merged) - 1, cost, detail))
        else:
            old = merged[existing]
            # Same counter twice: charge the sum once. It denies unless every use
            # is shadow, and alone unless every use that can deny is a quota one.
            shadow = old.shadow and limit.shadow_mode
            quota_use = limit.quota_mode or limit.shadow_mode
            merged[existing] = Bucket(
                key,
                min(old.limit, limit.requests_per_unit),
                old.cost + cost,
                window,
                shadow,
                old.prev_key,
                quota=not shadow and (old.quota or old.shadow) and quota_use,
            )
            plans.append(DescriptorPlan(limit, existing, cost, detail))
    return Plan(domain, True, tuple(plans), tuple(merged), {})
