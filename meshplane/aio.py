"""Waiting with a timeout without ever losing a cancellation.

On Python 3.11, ``asyncio.wait_for`` swallows a cancellation that arrives in
the same loop iteration as the awaited result (CPython gh-86296, fixed in
3.12): the caller gets the result and the ``CancelledError`` is gone. A
background loop stopped with ``task.cancel()`` while an event is being set
then runs one more round and waits again, and a SIGTERM drain waits on it
until the process is killed. ``asyncio.timeout`` counts cancellations per task
and always re-raises one it did not cause, so every timed wait goes through
it; ruff bans ``asyncio.wait_for`` in this project.
"""

from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, seconds: float | None) -> bool:
    """Whether ``event`` was set within ``seconds`` (None: wait for as long as it takes).

    A cancellation of the caller always propagates, even one that arrives as
    the event is set.
    """
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        return False
    return True
