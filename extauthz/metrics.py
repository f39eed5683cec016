"""Prometheus metrics of the ext_authz service.

Label sets are closed: ``mode`` is grpc|http, ``result`` allow|deny,
``reason`` one of ``reasons.Reason``, ``trigger``/``result`` of key refreshes
fixed strings. Policy names and URIs are deliberately not labels. The shared
runtime makes these correct across worker processes.

Check metrics are **aggregated in the process and flushed** every
``FLUSH_INTERVAL_SECONDS`` by the app (and at shutdown), instead of being
written per request. With several workers prometheus_client keeps values in
memory-mapped files, and each ``inc``/``observe`` takes a lock and packs
bytes: three such writes per check cost more CPU than the whole decision on
a token-cache hit. A dict increment costs next to nothing, and a scrape sees
values at most one flush interval old. Everything runs on the worker's event
loop thread, so no locking is needed.
"""

from __future__ import annotations

import bisect
import logging
import math

from prometheus_client import Counter, Histogram

from extauthz.reasons import Decision, Reason

log = logging.getLogger(__name__)

FLUSH_INTERVAL_SECONDS = 0.5
DURATION_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
)  # fmt: skip

CHECKS = Counter(
    "meshplane_extauthz_checks_total",
    "Authorization checks by transport mode, result and reason code.",
    ["mode", "result", "reason"],
)
CHECK_DURATION = Histogram(
    "meshplane_extauthz_check_duration_seconds",
    "Time spent deciding one check inside the server (excludes transport).",
    ["mode"],
    buckets=DURATION_BUCKETS,
)
KEY_REFRESHES = Counter(
    "meshplane_extauthz_key_refreshes_total",
    "Remote JWKS fetches by trigger (initial, ttl, kid_miss, manual) and result.",
    ["trigger", "result"],
)

MODES = ("grpc", "http")
# A check allows only with these reasons; every other reason is a deny.
ALLOW_REASONS = frozenset({Reason.OK, Reason.ALLOW_POLICY})
REFRESH_TRIGGERS = ("initial", "ttl", "kid_miss", "manual")
REFRESH_RESULTS = ("success", "error")


def _register_zeros() -> None:
    """Create every series of the closed label sets at 0, before any event.

    A series that appears only with its first event makes ``rate()`` and
    ``increase()`` miss that event (there is no earlier sample to compare
    with) and leaves "errors" panels empty instead of showing 0. The label
    sets are closed (modes, reasons, triggers), so this adds a fixed ~60
    series per process.
    """
    for mode in MODES:
        CHECK_DURATION.labels(mode)
        for reason in Reason:
            CHECKS.labels(mode, "allow" if reason in ALLOW_REASONS else "deny", reason.value)
    for trigger in REFRESH_TRIGGERS:
        for result in REFRESH_RESULTS:
            KEY_REFRESHES.labels(trigger, result)


_register_zeros()

_BOUNDS = (*DURATION_BUCKETS, math.inf)
_FIRST_BOUND = _BOUNDS[0]
# Adding n observations to one bucket at once needs the histogram child's
# bucket and sum values (prometheus_client has no bulk observe). If a future
# prometheus_client renames them, fall back to per-request observe().
_BULK_HISTOGRAM = all(hasattr(CHECK_DURATION.labels("grpc"), attr) for attr in ("_buckets", "_sum"))

_counts: dict[tuple[str, bool, Reason], int] = {}
_durations: dict[str, list[float]] = {}  # per mode: one count per bucket, then the sum


def record_check(mode: str, decision: Decision, seconds: float) -> None:
    """Count one decision in the process-local aggregate (hot path)."""
    key = (mode, decision.allowed, decision.reason)  # the label value at flush time
    _counts[key] = _counts.get(key, 0) + 1
    if not _BULK_HISTOGRAM:
        CHECK_DURATION.labels(mode).observe(seconds)
        return
    slots = _durations.get(mode)
    if slots is None:
        slots = _durations[mode] = [0.0] * (len(_BOUNDS) + 1)
    # A check on a cached token takes well under the first bound: one
    # comparison instead of a bisection (le is inclusive, as bisect_left).
    slots[0 if seconds <= _FIRST_BOUND else bisect.bisect_left(_BOUNDS, seconds)] += 1
    slots[-1] += seconds


def flush() -> None:
    """Move the aggregate into the Prometheus metrics (call on the loop thread)."""
    counts = dict(_counts)
    _counts.clear()
    durations = {mode: slots[:] for mode, slots in _durations.items()}
    _durations.clear()
    for (mode, allowed, reason), n in counts.items():
        CHECKS.labels(mode, "allow" if allowed else "deny", reason.value).inc(n)
    for mode, slots in durations.items():
        child = CHECK_DURATION.labels(mode)
        for index, observed in enumerate(slots[:-1]):
            if observed:
                child._buckets[index].inc(observed)
        child._sum.inc(slots[-1])
