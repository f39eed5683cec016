"""A local cache of buckets known to be empty, in front of the shared store.

Within a window a counter only grows, so once this instance has seen a bucket
with nothing left, every request that needs it is denied until the window
ends. And since a denied request charges nothing, answering such a request
locally is *exact*, not an approximation: the store would have changed
nothing either. Over-limit floods (the traffic a limiter exists for) then cost
no Redis command at all.

The cache also remembers the last counter seen for other buckets, so the
statuses of a locally denied request still carry a plausible
``limit_remaining`` for its other descriptors (it may be stale by what other
instances consumed since; the header values come from the empty bucket and
are exact).

Sliding windows are never cached: their count falls as the previous window
weighs less, so an empty one does not stay empty. Entries are keyed by
(key, limit): raising a limit in the config takes effect at once instead of
waiting for the window to end. The cache is a bounded LRU.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

from ratelimit.buckets import Bucket
from ratelimit.store import CounterStore, Outcome


class LocalCacheStore:
    """Wraps a CounterStore; answers requests that hit a known-empty bucket."""

    def __init__(
        self,
        inner: CounterStore,
        *,
        max_entries: int = 100_000,
        on_hit: Callable[[], None] | None = None,
    ) -> None:
        self._inner = inner
        self._max = max_entries
        # (key, limit) -> (window end, last counter seen)
        self._seen: OrderedDict[tuple[str, int], tuple[int, int]] = OrderedDict()
        self._on_hit = on_hit
        self.is_global = inner.is_global
        self.kind = inner.kind  # a cache in front: the span names the store behind it

    def __len__(self) -> int:
        return len(self._seen)

    async def apply(self, buckets: Sequence[Bucket], now: float) -> Outcome:
        # Plain loops, no zip(strict=True) nor lists of keys: every call pays them.
        seen = self._seen
        empty = False
        for b in buckets:
            entry = seen.get((b.key, b.limit))
            if entry is None:
                continue
            if entry[0] <= now:
                del seen[b.key, b.limit]
            elif entry[1] >= b.limit and not b.shadow and not b.quota:
                empty = True  # a quota bucket denies only with the others: ask the store
        if empty:
            return self._denied(buckets)
        outcome = await self._inner.apply(buckets, now)
        move_to_end = seen.move_to_end
        counts = outcome.counts
        for i, b in enumerate(buckets):
            if b.prev_key:  # a sliding count falls as time passes: never known empty
                continue
            entry_key = (b.key, b.limit)
            seen[entry_key] = (b.window.end, counts[i])
            move_to_end(entry_key)
        while len(seen) > self._max:
            seen.popitem(last=False)
        return outcome

    def _denied(self, buckets: Sequence[Bucket]) -> Outcome:
        """The answer when a bucket is known empty: nothing charged, and the
        last counters seen (the entries left are all current) as the counts."""
        if self._on_hit is not None:
            self._on_hit()
        seen = self._seen
        counts = tuple(entry[1] if (entry := seen.get((b.key, b.limit))) else 0 for b in buckets)
        fits = tuple(b.limit - c >= b.need for b, c in zip(buckets, counts, strict=True))
        return Outcome(False, counts, fits, from_cache=True)

    async def ping(self) -> None:
        await self._inner.ping()

    async def close(self) -> None:
        self._seen.clear()
        await self._inner.close()
