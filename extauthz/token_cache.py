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

Failures go to a second, smaller cache of their own (:data:`REFUSED_MAX_ENTRIES`
values of at most :data:`REFUSED_MAX_CHARS` characters): a client repeating a
forged or malformed token cost a full verification (base64, JSON, HMAC or
RSA) on every request, twice a valid token's cost. What is kept is a reason
that depends only on the header value, the policy's rules and its keys (see
``jwt_policy``), so it is exact for as long as the keys stay the same, and
the same generation rule drops it when they change. A refusal can only ever
answer a deny: nothing in it can become an allow. Refusals that depend on
the clock or the request (expired, not yet valid, path not allowed) or that
a JWKS refetch may cure (unknown kid, no keys) are never kept. Being
separate, refusals never evict a valid token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from extauthz.reasons import Decision

#: Refused header values kept per policy; with at most REFUSED_MAX_CHARS each,
#: junk tokens sent to fill it hold at most ~2 MiB (real JWTs are well under).
REFUSED_MAX_ENTRIES = 1024
REFUSED_MAX_CHARS = 2048

V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class CachedToken:
    nbf: float
    exp: float
    prefix: str | None
    allow: Decision


class TokenCache(Generic[V]):
    """Insertion-ordered dict with FIFO eviction; single event-loop thread only."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._entries: dict[str, V] = {}
        self._generation = -1

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, token: str, generation: int) -> V | None:
        if generation != self._generation:
            self._entries.clear()
            self._generation = generation
            return None
        return self._entries.get(token)

    def put(self, token: str, entry: V, generation: int) -> None:
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
