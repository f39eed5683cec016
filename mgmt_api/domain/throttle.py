"""Throttling of failed password logins (pure; the clock is passed in).

The rule (docs/api.md, "Throttling"), for an attempt at login ``L`` from
client address ``S``:

1. **Per (S, L):** 5 failures in the window are free; after that every
   attempt from S at L waits 1, 2, 4 ... s after the last failure (up to
   300 s; the first lock-out is ``MESHPLANE_LOGIN_LOCKOUT``, 1 s by
   default). This is what stops one client guessing one password.
2. **Per S:** the same with 100 free failures across all logins, against
   one client spraying many accounts.
3. **Per L, under attack:** once L has collected 20 failures in the window
   from all addresses together, a source that has itself failed at L in the
   window gets no more free failures: its next attempt at L already waits
   the first lock-out, then twice that, and so on. This slows many
   addresses guessing one account.

Every wait belongs to a source that has failed: an address with no failure
recorded is never refused, whatever others did, so nobody can lock an
account's owner out by guessing that account's password from elsewhere. A
success clears the (S, L) pair only: the source's and the login's counts go
on, so one good login does not buy a spraying client a fresh allowance.

A count starts with its first failure and lasts ``window`` seconds. The
tables are bounded (oldest evicted first) and keyed by a digest, so neither a
flood of made-up names nor long ones can exhaust memory.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

MAX_LOCKOUT = 300.0


@dataclass(frozen=True, slots=True)
class ThrottleRule:
    """The numbers of the rule above (module docstring)."""

    pair_free: int = 5
    source_free: int = 100
    login_under_attack: int = 20
    window: float = 300.0
    first_lockout: float = 1.0
    max_lockout: float = MAX_LOCKOUT

    @classmethod
    def with_first_lockout(cls, seconds: float) -> ThrottleRule:
        """The default rule with another first lock-out (the cap grows to it if below)."""
        return cls(first_lockout=seconds, max_lockout=max(MAX_LOCKOUT, seconds))


@dataclass(slots=True)
class _Count:
    failures: int
    first: float
    last: float


def _lockout(failures: int, free: int, rule: ThrottleRule) -> float:
    """Seconds refused after the last failure: first, twice that ... once past ``free``."""
    excess = failures - free
    if excess <= 0:
        return 0.0
    return min(rule.max_lockout, rule.first_lockout * float(2 ** min(excess - 1, 20)))


class FailureCounts:
    """Failures per key inside a window, in a bounded table (oldest key evicted)."""

    def __init__(self, window: float, max_keys: int = 10_000) -> None:
        self._window = window
        self._max_keys = max_keys
        self._entries: OrderedDict[bytes, _Count] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _key(*parts: str) -> bytes:
        return hashlib.blake2b("\x00".join(parts).encode(), digest_size=16).digest()

    def get(self, key: tuple[str, ...], now: float) -> _Count | None:
        """The key's count, or None if it has none in the current window."""
        with self._lock:
            count = self._entries.get(self._key(*key))
        if count is None or now - count.first > self._window:
            return None
        return count

    def add(self, key: tuple[str, ...], now: float) -> None:
        digest = self._key(*key)
        with self._lock:
            count = self._entries.get(digest)
            if count is None or now - count.first > self._window:
                count = _Count(0, now, now)
            count.failures += 1
            count.last = now
            self._entries[digest] = count
            self._entries.move_to_end(digest)
            while len(self._entries) > self._max_keys:
                self._entries.popitem(last=False)

    def clear(self, key: tuple[str, ...]) -> None:
        with self._lock:
            self._entries.pop(self._key(*key), None)

    def __len__(self) -> int:
        return len(self._entries)


class LoginThrottle:
    """The three counts of the rule and the wait they give one attempt."""

    def __init__(self, rule: ThrottleRule | None = None, max_keys: int = 10_000) -> None:
        self.rule = rule or ThrottleRule()
        window = self.rule.window
        self.pairs = FailureCounts(window, max_keys)
        self.sources = FailureCounts(window, max_keys)
        self.logins = FailureCounts(window, max_keys)

    def retry_after(self, source: str, login: str, now: float) -> float:
        """Seconds ``source`` must wait before trying ``login`` again (0 = go)."""
        rule = self.rule
        pair = self.pairs.get((source, login), now)
        by_source = self.sources.get((source,), now)
        wait = 0.0
        if pair is not None:
            free = rule.pair_free
            attacked = self.logins.get((login,), now)
            if attacked is not None and attacked.failures >= rule.login_under_attack:
                free = 0
            wait = pair.last + _lockout(pair.failures, free, rule) - now
        if by_source is not None:
            until = by_source.last + _lockout(by_source.failures, rule.source_free, rule)
            wait = max(wait, until - now)
        return max(0.0, wait)

    def failure(self, source: str, login: str, now: float) -> None:
        self.pairs.add((source, login), now)
        self.sources.add((source,), now)
        self.logins.add((login,), now)

    def success(self, source: str, login: str) -> None:
        self.pairs.clear((source, login))
