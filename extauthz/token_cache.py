"""A bounded cache of tokens whose signature and static claims were verified.

Entries are keyed by the raw ``Authorization`` value (one value, as sent).

Verifying an RS256/ES256 signature costs 50-150 µs of CPU; a dict hit costs
about 0.1 µs. Clients reuse one token for many requests, so caching turns the
common case into a lookup. What is cached is only what cannot change while
the keys stay the same: the signature verdict, ``nbf``/``exp``, the decoded
path prefix and the prebuilt allow decision. The time window is still checked
on every request by the caller. Every entry records the key-ring generation it
was verified under; when the keys change (rotation, reload) the whole cache is
dropped, so a removed key stops working at once.

Only successes are cached: a forged token costs the attacker a signature
check each time, but can never occupy a slot.
"""

from __future__ import annotations

from dataclasses import dataclass

from extauthz.reasons import Decision


@dataclass(frozen=True, slots=True)
class CachedToken:
    nbf: float
    exp: float
    prefix: str | None
    allow: Decision


class TokenCache:
    """Insertion-ordered dict with FIFO eviction; single event-loop thread only."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._entries: dict[str, CachedToken] = {}
        self._generation = -1

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, token: str, generation: int) -> CachedToken | None:
        if generation != self._generation:
            self._entries.clear()
            self._generation = generation
            return None
        return self._entries.get(token)

    def put(self, token: str, entry: CachedToken, generation: int) -> None:
        if self.max_entries <= 0:
            return
        if generation != self._generation:
            self._entries.clear()
            self._generation = generation
        if len(self._entries) >= self.max_entries:
            # Oldest insertion first; expired tokens are also removed on sight.
            del self._entries[next(iter(self._entries))]
        self._entries[token] = entry

    def discard(self, token: str) -> None:
        self._entries.pop(token, None)
