"""Prometheus metrics of the rate-limit service.

Per-rule counters carry ``domain`` and ``rule`` labels taken from the config
(the reference's stats path, e.g. ``key2`` or ``files_files/*``), never from
request values, so a key-only rule that gives every client its own bucket
still adds one series, not one per client. The exception is a rule with
``detailed_metric: true`` (or entries with ``value_to_metric: true``), whose
label is the reference's detailed (or value_to_metric) key
(``key_value`` with the request's values): those series are bounded per
worker (``detailedMetrics``), and hits past the bound are counted under
``<rule>:overflow``. Unknown domains come from
requests, so they are counted without a label (the domain is logged instead).
Counters count hits, i.e. the request's cost, like the reference's stats.

The metrics written on every decision (per-rule hits, decisions ok/over,
Redis decisions and round trips, local-cache hits, the latency histogram) are
**aggregated in the process and flushed** at most ``FLUSH_INTERVAL_SECONDS``
after they were recorded, and at shutdown (:func:`flush`), as the ext_authz
service does: with several workers prometheus_client keeps every value in a
memory-mapped file, and each ``inc``/``observe`` takes a lock, checks the pid
and packs bytes, which cost more CPU than the rest of a cached decision. A
dict update costs next to nothing; a scrape sees values at most one flush
interval old. Everything runs on the worker's event-loop thread, so no
locking is needed. Rare events (invalid requests, store errors, unknown
domains) are still written at once.
"""

from __future__ import annotations

import asyncio
import atexit
import bisect
import logging
import math
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

log = logging.getLogger(__name__)

FLUSH_INTERVAL_SECONDS = 0.5

_RULE = ("domain", "rule")
#: The rule label's suffix for detailed_metric hits past the series bound.
OVERFLOW_SUFFIX = ":overflow"

TOTAL_HITS = Counter(
    "meshplane_ratelimit_total_hits", "Hits (cost units) presented to a rule.", _RULE
)
OVER_LIMIT = Counter(
    "meshplane_ratelimit_over_limit",
    "Hits a rule could not cover (shadow rules included).",
    _RULE,
)
NEAR_LIMIT = Counter(
    "meshplane_ratelimit_near_limit",
    "Hits consumed above nearLimitRatio of a rule's limit.",
    _RULE,
)
WITHIN_LIMIT = Counter(
    "meshplane_ratelimit_within_limit",
    "Hits consumed (allowed); near_limit counts the subset above nearLimitRatio.",
    _RULE,
)
SHADOW_MODE = Counter(
    "meshplane_ratelimit_shadow_mode",
    "Hits over a shadow-mode rule's limit that were let through.",
    _RULE,
)
DECISIONS = Counter(
    "meshplane_ratelimit_decisions",
    "ShouldRateLimit answers by result.",
    ("result",),  # DECISION_RESULTS
)
UNKNOWN_DOMAIN = Counter(
    "meshplane_ratelimit_unknown_domain", "Requests for a domain absent from the config."
)
STORE_ERRORS = Counter(
    "meshplane_ratelimit_store_errors",
    "Decisions the counter store could not answer, by reason.",
    ("reason",),  # STORE_ERROR_REASONS
)
LOCAL_CACHE_HITS_COUNTER = Counter(
    "meshplane_ratelimit_local_cache_hits",
    "Requests denied from the local cache of empty buckets, without the store.",
)
REDIS_ROUND_TRIPS_COUNTER = Counter(
    "meshplane_ratelimit_redis_round_trips", "Pipelines sent to Redis."
)
REDIS_DECISIONS_COUNTER = Counter(
    "meshplane_ratelimit_redis_decisions", "Decisions sent to Redis (one script call each)."
)
QUOTA_REPORTS = Counter(
    "meshplane_ratelimit_quota_reports", "RLQS usage reports received from gateways."
)
QUOTA_ACTIONS = Counter(
    "meshplane_ratelimit_quota_actions",
    "RLQS bucket actions sent, by kind: token_bucket, allow_all, deny_all (answers to a "
    "report), pushed (a share changed by another gateway's report), abandon, expire_on_drain.",
    ("action",),
)
REDIS_UNREACHABLE = Gauge(
    "meshplane_ratelimit_redis_unreachable",
    "1 while the Redis store in force does not answer the readiness PING of a worker.",
    multiprocess_mode="livemax",
)
_LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.05,
    0.1,
)
LATENCY = Histogram(
    "meshplane_ratelimit_decision_seconds",
    "Time to decide one ShouldRateLimit request, store included.",
    buckets=_LATENCY_BUCKETS,
)

# Pending increments, keyed by the counter child they belong to. ``pending``
# is the same dict, for the hot path's own loops (a dict update inline costs
# less than a call of add() per counter).
_pending: dict[Any, float] = {}
pending = _pending
_BOUNDS = (*_LATENCY_BUCKETS, math.inf)
# One count per latency bucket, then the sum of the observations.
_latency: list[float] = [0.0] * (len(_BOUNDS) + 1)
# prometheus_client has no bulk observe: adding n observations at once needs
# the histogram's bucket and sum values. If a future release renames them,
# fall back to one observe() per decision.
_BULK_HISTOGRAM = hasattr(LATENCY, "_buckets") and hasattr(LATENCY, "_sum")


class _Armed:
    """The loop on which a flush is scheduled, if any."""

    loop: asyncio.AbstractEventLoop | None = None


_armed = _Armed()


def add(child: Any, amount: float = 1) -> None:
    """Count ``amount`` on a counter (child) in the process-local aggregate."""
    _pending[child] = _pending.get(child, 0) + amount


def observe_latency(seconds: float) -> None:
    """One decision's duration, in the process-local aggregate."""
    if not _BULK_HISTOGRAM:  # pragma: no cover - depends on prometheus_client internals
        LATENCY.observe(seconds)
        return
    _latency[bisect.bisect_left(_BOUNDS, seconds)] += 1
    _latency[-1] += seconds


def schedule_flush() -> None:
    """Make sure a flush runs within FLUSH_INTERVAL_SECONDS (on the running loop).

    Called on every decision: while the loop a flush is armed on runs, it
    returns at once, without ``asyncio.get_running_loop()``, which makes a
    ``getpid`` system call each time on Python 3.11 (seen in profiles)."""
    armed = _armed.loop
    if armed is not None and armed.is_running():
        return
    loop = asyncio.get_running_loop()
    _armed.loop = loop
    loop.call_later(FLUSH_INTERVAL_SECONDS, _flush_from_timer)


def _flush_from_timer() -> None:
    _armed.loop = None
    try:
        flush()
    except Exception:  # pragma: no cover - a metrics failure must not break serving
        log.exception("flushing rate-limit metrics failed")


def flush() -> None:
    """Move the aggregate into the Prometheus metrics (call on the loop thread)."""
    pending = list(_pending.items())
    _pending.clear()
    latency = _latency[:]
    _latency[:] = [0.0] * len(_latency)
    for child, amount in pending:
        child.inc(amount)
    if latency[-1] or any(latency[:-1]):
        for index, observed in enumerate(latency[:-1]):
            if observed:
                LATENCY._buckets[index].inc(observed)
        LATENCY._sum.inc(latency[-1])


# The app flushes when a worker stops; this also covers an exit that skips it.
atexit.register(flush)


class _Batched:
    """A counter whose ``inc`` goes to the aggregate (for hot-path callbacks)."""

    __slots__ = ("counter",)

    def __init__(self, counter: Any) -> None:
        self.counter = counter

    def inc(self, amount: float = 1) -> None:
        _pending[self.counter] = _pending.get(self.counter, 0) + amount


REDIS_ROUND_TRIPS = _Batched(REDIS_ROUND_TRIPS_COUNTER)
REDIS_DECISIONS = _Batched(REDIS_DECISIONS_COUNTER)
LOCAL_CACHE_HITS = _Batched(LOCAL_CACHE_HITS_COUNTER)

DECIDED_OK = DECISIONS.labels("ok")
DECIDED_OVER = DECISIONS.labels("over_limit")

# The closed label sets, created at 0 when a worker imports this module, so
# ``rate()``/``increase()`` count the first event and error panels show 0
# instead of nothing. Per-rule counters are created from the config
# (RateLimitService.register_rules).
DECISION_RESULTS = (
    "ok", "over_limit", "invalid", "unknown_domain", "store_unavailable",
    "failure_allow", "failure_deny",
)  # fmt: skip
STORE_ERROR_REASONS = ("timeout", "redis_error", "breaker_open", "script_mismatch")
for _result in DECISION_RESULTS:
    DECISIONS.labels(_result)
for _reason in STORE_ERROR_REASONS:
    STORE_ERRORS.labels(_reason)


@dataclass(frozen=True, slots=True)
class RuleCounters:
    """The labelled children of one rule, resolved once (``labels()`` is slow)."""

    total_hits: Any
    over_limit: Any
    near_limit: Any
    within_limit: Any
    shadow_mode: Any

    @classmethod
    def of(cls, domain: str, rule: str) -> RuleCounters:
        return cls(
            TOTAL_HITS.labels(domain, rule),
            OVER_LIMIT.labels(domain, rule),
            NEAR_LIMIT.labels(domain, rule),
            WITHIN_LIMIT.labels(domain, rule),
            SHADOW_MODE.labels(domain, rule),
        )
