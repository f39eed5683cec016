"""Throttling of repeated authentication failures (pure; the clock is passed in).

After ``free_failures`` failures for one key (a login name, or a client
address) inside ``window`` seconds, each further attempt is refused for a
lock-out that doubles per failure, up to ``max_lockout``. A success clears the
key. The table is bounded: the oldest keys are evicted first, so a flood of
made-up names cannot exhaust memory.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(slots=True)
class _Entry:
    failures: int
    first: float
    locked_until: float


class FailureThrottle:
    def __init__(
        self,
        free_failures: int = 5,
        window: float = 300.0,
        max_lockout: float = 300.0,
        max_keys: int = 10_000,
    ) -> None:
        self._free = free_failures
        self._window = window
        self._max_lockout = max_lockout
        self._max_keys = max_keys
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def retry_after(self, key: str, now: float) -> float:
        """Seconds the caller must wait before trying ``key`` again (0 = go)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return 0.0
            return max(0.0, entry.locked_until - now)

    def failure(self, key: str, now: float) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or now - entry.first > self._window:
                entry = _Entry(0, now, 0.0)
            entry.failures += 1
            excess = entry.failures - self._free
            if excess > 0:
                entry.locked_until = now + min(self._max_lockout, float(2 ** min(excess - 1, 20)))
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self._max_keys:
                self._entries.popitem(last=False)

    def success(self, key: str) -> None:
        with self._lock:
            self._entries.pop(key, None)
