"""Wake-ups for streams when stored configuration changes.

The store bumps a revision counter on every write. Writers in this process
call :meth:`ChangeFeed.notify` right after commit; a slow poll of the stored
revision covers writers in other replicas of the management plane. Streams
wait on the feed instead of polling the database each.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable


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
        event = self._changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), max_wait)
        return self._revision

    async def poll_store(self, interval: float = 1.0) -> None:
        """Follow the stored revision (other replicas' writes); cancel to stop."""
        if self._read_revision is None:
            return
        while True:
            self.notify(await self._read_revision())
            await asyncio.sleep(interval)
