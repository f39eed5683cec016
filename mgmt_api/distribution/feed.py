"""Wake-ups for streams when stored configuration changes.

The store bumps a revision counter on every write. Writers in this process
call :meth:`ChangeFeed.notify` right after commit; a slow poll of the stored
revision covers writers in other replicas of the management plane. Streams
wait on the feed instead of polling the database each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from meshplane.aio import wait_event

K = TypeVar("K")
V = TypeVar("V")


class ChangeFeed:
    """A monotonically increasing revision that streams can wait on."""

    def __init__(self, read_revision: Callable[[], Awaitable[int]] | None = None) -> None:
        self._revision = 0
        self._changed = asyncio.Event()
        self._read_revision = read_revision

    @property
    def revision(self) -> int:
        return self._revision

    def notify(self, revision: int | None = None) -> None:
        """Record a new revision (or just "something changed") and wake waiters."""
        new = self._revision + 1 if revision is None else revision
        if new > self._revision:
            self._revision = new
            self._changed.set()
            self._changed = asyncio.Event()

    async def wait_beyond(self, revision: int, max_wait: float | None = None) -> int:
        """Return once the revision exceeds ``revision`` (or after ``max_wait``)."""
        if self._revision > revision:
            return self._revision
        await wait_event(self._changed, max_wait)
        return self._revision

    async def poll_store(self, interval: float = 1.0) -> None:
        """Follow the stored revision (other replicas' writes); cancel to stop."""
        if self._read_revision is None:
            return
        while True:
            self.notify(await self._read_revision())
            await asyncio.sleep(interval)


class SharedBuilds(Generic[K, V]):
    """Build once per key and feed revision, however many streams wake for it.

    A write wakes every stream of a cluster at once, and they all need the
    same compiled artifact. A build started when the feed was at ``revision``
    or later has seen every write up to ``revision`` (the feed only moves after
    a commit), so a stream may join it; an older one it may not. A failed
    build is not shared with later callers.
    """

    def __init__(self, feed: ChangeFeed, build: Callable[[K], Awaitable[V]]) -> None:
        self._feed = feed
        self._build = build
        self._builds: dict[K, tuple[int, asyncio.Future[V]]] = {}

    async def get(self, key: K, revision: int) -> V:
        entry = self._builds.get(key)
        if entry is None or entry[0] < revision or (entry[1].done() and entry[1].exception()):
            started = self._feed.revision
            future = asyncio.ensure_future(self._build(key))
            entry = self._builds[key] = (started, future)
        return await asyncio.shield(entry[1])
