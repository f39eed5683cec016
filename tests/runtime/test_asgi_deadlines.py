"""``grpc-timeout`` in the ASGI adapter, in process: the shared deadline timer
cancels a handler past its deadline (DEADLINE_EXCEEDED), lets any other
cancellation through, and does not keep finished calls forever.

The same rules run through real sockets in ``test_transports.py``; these
tests reach what a socket cannot arrange (a cancellation from outside, the
heap of finished calls)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from meshplane.asgi_grpc import GrpcAsgiApp
from meshplane.grpc_wire import Code, frame
from meshplane.rpc import HealthState, Services

PATH = "/test.Blocking/Call"


def _app(handler: Any) -> GrpcAsgiApp:
    services = Services()
    services.add_unary("test.Blocking", "Call", handler)
    return GrpcAsgiApp(services, HealthState(), ("test.Blocking",))


async def _call(app: GrpcAsgiApp, timeout: str | None) -> list[dict[str, Any]]:
    headers = [(b"content-type", b"application/grpc")]
    if timeout is not None:
        headers.append((b"grpc-timeout", timeout.encode()))
    scope = {"type": "http", "method": "POST", "path": PATH, "headers": headers}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": frame(b"x"), "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def _status(sent: list[dict[str, Any]]) -> int:
    for message in sent:
        for name, value in message.get("headers", []):
            if name == b"grpc-status":
                return int(value)
    raise AssertionError(f"no grpc-status in {sent}")


async def test_a_handler_past_its_deadline_is_cancelled() -> None:
    cancelled = asyncio.Event()

    async def forever(request: bytes) -> bytes:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return b""

    app = _app(forever)
    sent = await _call(app, "5m")
    assert _status(sent) == Code.DEADLINE_EXCEEDED
    assert cancelled.is_set()
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_a_handler_within_its_deadline_answers() -> None:
    async def echo(request: bytes) -> bytes:
        await asyncio.sleep(0)
        return request

    app = _app(echo)
    sent = await _call(app, "1S")
    assert _status(sent) == Code.OK
    assert any(m.get("body") == frame(b"x") for m in sent)


async def test_a_cancellation_that_is_not_the_deadline_goes_through() -> None:
    started = asyncio.Event()

    async def forever(request: bytes) -> bytes:
        started.set()
        await asyncio.Event().wait()
        return b""

    app = _app(forever)
    call = asyncio.ensure_future(_call(app, "100S"))
    await started.wait()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call


async def test_finished_calls_do_not_pile_up_behind_a_pending_one() -> None:
    """A call still running with the earliest deadline keeps the heap's top:
    the calls that finish meanwhile (later deadlines) must still be dropped."""
    release = asyncio.Event()

    async def blocked(request: bytes) -> bytes:
        if not release.is_set():
            await release.wait()
        return request

    app = _app(blocked)
    pending = asyncio.ensure_future(_call(app, "1000S"))
    await asyncio.sleep(0)
    release.set()  # from now on calls answer at once, without suspending: the
    for _ in range(5000):  # first one stays pending until this loop yields
        assert _status(await _call(app, "2000S")) == Code.OK
    assert len(app.deadlines) <= 2 * 1024 + 1
    assert _status(await pending) == Code.OK
