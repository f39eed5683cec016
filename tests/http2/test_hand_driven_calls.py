"""The h2 backend runs a read's calls in one task, started by hand (``h2_protocol._drain``)
and, when one suspends, resumed by hand (``h2_protocol._resume``): pinned here.

``_resume`` exists because the call was already started with ``send(None)``
(to learn whether it finishes without suspending, the usual Check), so the
future it is waiting on has been taken out of it: a plain ``await call`` would
fail: Python refuses to await a coroutine that is suspended in the
middle (first test). ``_resume`` hands that future to the
task and relays wake-ups, results, exceptions and cancellations, as an
``await`` from the start would have.

``_drain`` is driven through a real :class:`H2Protocol` and the real
:class:`GrpcAsgiApp`, fed by the ``h2`` library as the client, with a
recording transport (a fake of the socket: it keeps what is written).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import h2.config
import h2.connection
import h2.events
import hpack
import pytest

from meshplane.asgi_grpc import GrpcAsgiApp
from meshplane.grpc_wire import frame
from meshplane.rpc import HealthState, Services
from meshplane.servers.h2.protocol import ConnectionSet, H2Settings, H2Stats, _block_of, _resume


def _started(call: Coroutine[Any, Any, None]) -> Any:
    """Start ``call`` by hand, as ``_drain`` does: what it waits on."""
    return call.send(None)


async def test_a_plain_await_of_a_call_started_by_hand_fails_which_is_why_resume_exists() -> None:
    future: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def call() -> None:
        await future

    started = call()
    _started(started)

    async def plain() -> None:
        await started  # resumes it without the future it waits on

    with pytest.raises(RuntimeError, match="awaited already"):
        await asyncio.create_task(plain())
    future.cancel()


async def test_resume_gives_the_call_its_result_exception_and_cancellation() -> None:
    loop = asyncio.get_running_loop()
    seen: list[object] = []

    async def call(future: asyncio.Future[str]) -> None:
        try:
            seen.append(await future)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        except ValueError as exc:
            seen.append(exc)

    async def drive(future: asyncio.Future[str]) -> None:
        started = call(future)
        await _resume(started, _started(started))

    ok: asyncio.Future[str] = loop.create_future()
    task = asyncio.create_task(drive(ok))
    await asyncio.sleep(0)
    ok.set_result("value")
    await task
    failing: asyncio.Future[str] = loop.create_future()
    task = asyncio.create_task(drive(failing))
    await asyncio.sleep(0)
    error = ValueError("boom")
    failing.set_exception(error)
    await task
    never: asyncio.Future[str] = loop.create_future()
    task = asyncio.create_task(drive(never))
    await asyncio.sleep(0)
    task.cancel()  # a deadline or a reset cancels the task: the call hears it
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["value", error, "cancelled"]


class RecordingTransport:
    """A fake of the socket's transport: keeps what the protocol writes."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 9000)}.get(
            name, default
        )

    def close(self) -> None: ...

    def abort(self) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


async def test_drain_runs_the_calls_after_a_suspended_one_and_a_reset_cancels_only_it() -> None:
    release: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    tasks: list[asyncio.Task[Any] | None] = []
    cancelled: list[bool] = []

    async def wait(request: bytes) -> bytes:
        tasks.append(asyncio.current_task())
        try:
            await release
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return request

    async def echo(request: bytes) -> bytes:
        tasks.append(asyncio.current_task())
        return request

    services = Services()
    services.add_unary("t.S", "Wait", wait)
    services.add_unary("t.S", "Echo", echo)
    app = GrpcAsgiApp(services, HealthState(), ("t.S",))
    proto = ConnectionSet(app, H2Settings(), H2Stats()).protocol()
    transport = RecordingTransport()
    proto.connection_made(transport)  # type: ignore[arg-type]
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    for stream, method in ((1, "Wait"), (3, "Echo"), (5, "Echo")):
        client.send_headers(stream, [(":method", "POST"), (":scheme", "http"),
                                     (":path", f"/t.S/{method}"), (":authority", "x"),
                                     ("content-type", "application/grpc")])  # fmt: skip
        client.send_data(stream, frame(b"hi"), end_stream=True)
    proto.data_received(client.data_to_send())  # one read, three calls: one drain

    ended: set[int] = set()

    async def turn() -> None:
        for _ in range(20):
            await asyncio.sleep(0)
        for event in client.receive_data(bytes(transport.data)):
            if isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
                ended.add(event.stream_id)
        transport.data.clear()

    await turn()
    assert ended == {3, 5}  # they did not wait behind the suspended call
    assert len(tasks) == 3
    assert tasks[0] is not tasks[1]  # the suspended call kept the drain's task for itself
    assert tasks[1] is tasks[2]  # the rest ran in one new drain, without a task each
    client.reset_stream(1)
    proto.data_received(client.data_to_send())
    await turn()
    assert cancelled == [True]  # the reset cancelled its task, and only that one
    assert proto.streams == {}
    assert release.cancelled()  # what it waited on went with it


def test_the_block_cache_by_identity_never_answers_a_freed_message_for_a_new_one() -> None:
    """``_block_of`` looks a message up by ``id()`` first; the entry holds the message,
    so its id cannot go to another object while the entry lives, and the hit is
    checked by identity: thousands of short-lived messages (ids reused by CPython
    as soon as they are freed) each get their own headers back."""
    for n in range(2000):
        message = {"type": "http.response.start", "status": 200,
                   "headers": [(b"x-n", str(n).encode())]}  # fmt: skip
        decoded = hpack.Decoder().decode(_block_of(message, 200), raw=True)
        assert decoded == [(b":status", b"200"), (b"x-n", str(n).encode())]
        del message
