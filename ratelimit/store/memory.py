"""In-memory counters for a single instance (no Redis URL given).

Counters live in this process only, so limits are per instance, not global;
the CLI logs that and refuses more than one worker. Entries are dropped once
their window has ended, swept every so often from the request path (there is
no background task to forget to start).
"""

from __future__ import annotations

from collections.abc import Sequence

from ratelimit.buckets import Bucket
from ratelimit.store import Outcome, decide, weighted

_SWEEP_EVERY = 4096


class MemoryStore:
    """A dict of ``key -> (count, expiry)``, decided with :func:`decide`.

    Per key: one dict entry (about 200 bytes with its key string); a sliding
    window keeps two live keys per bucket (this window's and the previous).
    """

    is_global = False
    kind = "memory"

    def __init__(self) -> None:
        self._counters: dict[str, tuple[int, int]] = {}
        self._calls = 0

    def __len__(self) -> int:
        return len(self._counters)

    async def apply(self, buckets: Sequence[Bucket], now: float) -> Outcome:
        # No await between read and write: atomic within the event loop.
        self._calls += 1
        if self._calls % _SWEEP_EVERY == 0:
            self.sweep(now)
        counters = self._counters
        before = [self._count(b.key, now) for b in buckets]
        previous = [self._count(b.prev_key, now) for b in buckets if b.prev_key]
        seen = weighted(buckets, before, previous, now) if previous else before
        outcome = decide(buckets, seen)
        if outcome.allowed:
            for b, old, fit in zip(buckets, before, outcome.fits, strict=True):
                if fit and b.cost > 0:
                    counters[b.key] = (old + b.cost, b.expires)
        return outcome

    def _count(self, key: str, now: float) -> int:
        entry = self._counters.get(key)
        return entry[0] if entry is not None and entry[1] > now else 0

    def sweep(self, now: float) -> None:
        """Forget counters whose window has ended."""
        expired = [k for k, (_, end) in self._counters.items() if end <= now]
        for key in expired:
            del self._counters[key]

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        self._counters.clear()
