"""The counter store interface and the one decision rule every store implements.

``apply(buckets, now)`` decides atomically over all of a request's buckets:
either every bucket that can cover its cost is charged (the request is
allowed), or nothing is charged at all (the request is denied). The Redis Lua
script and the in-memory store both implement :func:`decide`; keeping the
rule here in pure form lets the tests pin it once and compare both stores.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from ratelimit.buckets import Bucket


class StoreUnavailable(Exception):
    """The store could not answer in time; ``reason`` is a bounded metric label."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class Outcome(NamedTuple):
    """The decision over one request's buckets, per bucket in the order given.

    ``counts`` are the counters after the decision; ``fits`` says whether each
    bucket could cover its cost (for shadow buckets: whether it would have).
    ``from_cache`` is set when the local cache answered without the store.
    """

    allowed: bool
    counts: tuple[int, ...]
    fits: tuple[bool, ...]
    from_cache: bool = False

    def remaining(self, buckets: Sequence[Bucket]) -> tuple[int, ...]:
        return tuple(max(0, b.limit - c) for b, c in zip(buckets, self.counts, strict=True))


def weighted(
    buckets: Sequence[Bucket], before: Sequence[int], previous: Sequence[int], now: float
) -> list[int]:
    """Each bucket's count as the decision sees it: for a sliding window, its
    own window's counter plus the previous window's, weighted by the part of
    the previous window the sliding window (``now - length .. now``) still
    covers, rounded up (so rounding never admits more).

    ``previous`` holds the previous counters of the sliding buckets only, in
    order. The arithmetic is the Lua script's, operation for operation in
    doubles, on the clock in whole milliseconds, so both give equal counts.
    """
    now_ms = math.floor(now * 1000)
    counts = list(before)
    j = 0
    for i, b in enumerate(buckets):
        if b.prev_key:
            left = float(b.window.end * 1000 - now_ms)
            counts[i] += math.ceil(float(previous[j]) * left / float(b.window.seconds * 1000))
            j += 1
    return counts


def decide(buckets: Sequence[Bucket], before: Sequence[int]) -> Outcome:
    """The decision rule, given each bucket's counter before the request
    (for a sliding window, its :func:`weighted` count).

    A bucket fits when ``limit - count >= max(cost, 1)``. The request is
    allowed when every binding bucket fits (neither shadow nor quota) and,
    if the request has quota buckets, at least one of them fits: as the
    reference's ``quota_mode``, a request is over the limit when all its
    quota descriptors are. Then each fitting bucket is charged its cost (a
    shadow or quota bucket that would not fit is left as is, so no counter
    ever exceeds its limit). A denied request charges nothing.
    A store charges a sliding bucket's own window's counter only.
    """
    fits: list[bool] = []
    after: list[int] = []
    allowed = True
    quota_missed = False
    # One pass (a decision's hot path), by index: ``zip(..., strict=True)``
    # alone costs more than this whole loop for two buckets (a keyword call).
    for i, b in enumerate(buckets):
        c = before[i]
        cost = b.cost
        fit = b.limit - c >= (cost if cost > 0 else 1)
        fits.append(fit)
        after.append(c + cost if fit else c)
        if not fit and not b.shadow:
            if b.quota:
                quota_missed = True
            else:
                allowed = False
    if quota_missed and allowed:
        # Only read when a quota bucket missed: a request without any pays nothing.
        allowed = any(fit for b, fit in zip(buckets, fits, strict=True) if b.quota)
    if not allowed:
        return Outcome(False, tuple(before), tuple(fits))
    return Outcome(True, tuple(after), tuple(fits))


class CounterStore(Protocol):
    """Where counters live: one process (memory) or shared by all (Redis)."""

    #: True when counters are shared by every instance.
    is_global: bool
    #: Where the counters live ("memory", "redis"): a wrapper says its inner
    #: store's, so the store span names the store a request really reaches.
    kind: str

    async def apply(self, buckets: Sequence[Bucket], now: float) -> Outcome:
        """Decide atomically; buckets have distinct keys. Raises StoreUnavailable."""
        ...

    async def ping(self) -> None:
        """Raise if the store cannot be reached; used for readiness."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...
