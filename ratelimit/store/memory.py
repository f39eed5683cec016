"""In-memory counters for a single instance (no Redis URL given).

Counters live in this process only, so limits are per instance, not global;
the CLI logs that and refuses more than one worker. Entries are dropped once
their window has ended, swept every so often from the request path (there is
no background task to forget to start).
"""

from __future__ import annotations

from collections.abc import Sequence

from ratelimit.buckets import Bucket
from ratelimit.store import Outcome, decide

_SWEEP_EVERY = 4096


class MemoryStore:
    """A dict of ``key -> (count, window end)``, decided with :func:`decide`."""

    is_global = False

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
        before = []
        for b in buckets:
            entry = self._counters.get(b.key)
            before.append(entry[0] if entry is not None and entry[1] > now else 0)
        outcome = decide(buckets, before)
        if outcome.allowed:
            for b, old, new in zip(buckets, before, outcome.counts, strict=True):
                if new != old:
                    self._counters[b.key] = (new, b.window.end)
        return outcome

    def sweep(self, now: float) -> None:
        """Forget counters whose window has ended."""
        expired = [k for k, (_, end) in self._counters.items() if end <= now]
        for key in expired:
            del self._counters[key]

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        self._counters.clear()
