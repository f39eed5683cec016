"""Prometheus metrics of the rate-limit service.

Per-rule counters carry ``domain`` and ``rule`` labels taken from the config
(the reference's stats path, e.g. ``key2`` or ``files_files/*``), never from
request values, so a key-only rule that gives every client its own bucket
still adds one series, not one per client. Unknown domains come from
requests, so they are counted without a label (the domain is logged instead).
Counters count hits, i.e. the request's cost, like the reference's stats.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Histogram

_RULE = ("domain", "rule")

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
    "Hits consumed below nearLimitRatio of a rule's limit.",
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
    # ok | over_limit | invalid | unknown_domain | store_unavailable | failure_allow | failure_deny
    ("result",),
)
UNKNOWN_DOMAIN = Counter(
    "meshplane_ratelimit_unknown_domain", "Requests for a domain absent from the config."
)
STORE_ERRORS = Counter(
    "meshplane_ratelimit_store_errors",
    "Decisions the counter store could not answer, by reason.",
    ("reason",),  # timeout | redis_error | breaker_open | ...
)
LOCAL_CACHE_HITS = Counter(
    "meshplane_ratelimit_local_cache_hits",
    "Requests denied from the local cache of empty buckets, without the store.",
)
REDIS_ROUND_TRIPS = Counter("meshplane_ratelimit_redis_round_trips", "Pipelines sent to Redis.")
REDIS_DECISIONS = Counter(
    "meshplane_ratelimit_redis_decisions", "Decisions sent to Redis (one script call each)."
)
LATENCY = Histogram(
    "meshplane_ratelimit_decision_seconds",
    "Time to decide one ShouldRateLimit request, store included.",
    buckets=(
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
    ),
)


DECIDED_OK = DECISIONS.labels("ok")
DECIDED_OVER = DECISIONS.labels("over_limit")


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
