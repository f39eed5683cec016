"""One policy's view of its verification keys: static keys plus remote JWKS.

The ring holds no I/O of its own. Remote sources (``jwks_remote``) replace
their ``KeySet`` and bump ``version`` from a background task; the ring notices
on the next read by comparing versions, rebuilds its merged set once and bumps
its own ``generation``, which is what invalidates the token cache. Polling
versions instead of registering callbacks means an old ring from a previous
config simply becomes garbage, with nothing to unregister.
"""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Sequence
from typing import Protocol

from extauthz.keys import KeySet, VerifyKey


class RemoteKeys(Protocol):
    """A key source refreshed elsewhere (see ``jwks_remote.RemoteJwks``)."""

    @property
    def keys(self) -> KeySet: ...

    @property
    def version(self) -> int: ...

    @property
    def kid_miss_wait_seconds(self) -> float: ...

    def request_refetch(self) -> asyncio.Future[bool] | None: ...


_VERSION = operator.attrgetter("version")


class KeyRing:
    def __init__(self, static: Sequence[VerifyKey], remotes: Sequence[RemoteKeys] = ()) -> None:
        self._static = KeySet.of(tuple(static))
        self._remotes = tuple(remotes)
        self._versions: tuple[int, ...] = tuple(-1 for _ in self._remotes)
        self._keys = self._static
        self.generation = 0
        self.current()

    @property
    def has_remotes(self) -> bool:
        return bool(self._remotes)

    def current(self) -> tuple[KeySet, int]:
        """The merged key set and its generation (cheap when nothing changed)."""
        if self._remotes:
            # map + attrgetter: no generator frame on every check.
            versions = tuple(map(_VERSION, self._remotes))
            if versions != self._versions:
                merged = self._static
                for remote in self._remotes:
                    merged = merged.merged(remote.keys)
                self._keys = merged
                self._versions = versions
                self.generation += 1
        return self._keys, self.generation

    def request_refetch(self) -> tuple[asyncio.Future[list[bool]], float] | None:
        """Ask every remote for a kid-miss refetch (each rate-limits itself).

        Returns an awaitable for the refetches that were actually started or
        already running, and how long a request may wait for them; None if
        every source declined (rate limit), in which case the caller denies
        immediately.
        """
        started = [(r.request_refetch(), r.kid_miss_wait_seconds) for r in self._remotes]
        futures = [f for f, _ in started if f is not None]
        if not futures:
            return None
        wait = max(w for f, w in started if f is not None)
        return asyncio.gather(*futures, return_exceptions=False), wait
