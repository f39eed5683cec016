"""meshplane.aio: a timed wait never loses the caller's cancellation."""

from __future__ import annotations

import asyncio

import pytest

from meshplane.aio import wait_event
from mgmt_api.distribution.feed import ChangeFeed


async def test_wait_event_says_whether_the_event_was_set_in_time() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    event.set()
    assert await wait_event(event, 0.01) is True
    assert await wait_event(event, None) is True


async def _cancelled_as_it_wakes(waiter: asyncio.Task[object], wake: object) -> None:
    """Wake ``waiter`` and cancel it in the same loop iteration: it must end cancelled.

    ``asyncio.wait_for`` on Python 3.11 returns the result here instead, and a
    background loop stopped this way runs on (a drain that never ends).
    """
    await asyncio.sleep(0)  # the waiter is parked on the event
    assert callable(wake)
    wake()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(10):
            await waiter


async def test_a_cancellation_that_arrives_as_the_event_is_set_propagates() -> None:
    event = asyncio.Event()
    waiter = asyncio.create_task(wait_event(event, 60))
    await _cancelled_as_it_wakes(waiter, event.set)


async def test_a_feed_waiter_cancelled_as_the_feed_moves_ends() -> None:
    feed = ChangeFeed()

    async def loop_on_the_feed() -> None:  # the shape of every stream and pusher loop
        seen = feed.revision
        while True:
            seen = await feed.wait_beyond(seen, 60)

    waiter = asyncio.create_task(loop_on_the_feed())
    await _cancelled_as_it_wakes(waiter, feed.notify)
