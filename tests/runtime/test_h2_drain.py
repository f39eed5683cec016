"""The h2 backend runs the calls of one read in one task (``H2Protocol._drain``):
a call that suspends keeps that task and the calls after it go on without it,
its deadline and a reset reach it alone, and no call's trace headers reach the
next one.

In process on uvloop, with a fake transport that keeps what is written (the
same calls run through real sockets in ``test_h2_backend.py`` and the runtime
tables)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import hpack

from meshplane.asgi_grpc import GrpcAsgiApp
from meshplane.grpc_wire import Code
from meshplane.grpc_wire import frame as grpc_frame
from meshplane.rpc import HealthState, Services, incoming_trace_context
from meshplane.servers.h2.http2.connection import PREFACE, frame
from meshplane.servers.h2.protocol import ConnectionSet, H2Protocol, H2Settings, H2Stats

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class FakeTransport:
    """Keeps the bytes written; the peer's side of the socket."""

    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def close(self) -> None: ...

    def abort(self) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


def _statuses(written: bytes) -> dict[int, int]:
    """grpc-status by stream id, from the HEADERS frames written."""
    decoder = hpack.Decoder()
    out: dict[int, int] = {}
    while written:
        size = int.from_bytes(written[:3], "big")
        kind, stream_id = written[3], int.from_bytes(written[5:9], "big") & 0x7FFFFFFF
        if kind == 1:
            for name, value in decoder.decode(written[9 : 9 + size], raw=True):
                if name == b"grpc-status":
                    out[stream_id] = int(value)
        written = written[9 + size :]
    return out


def _request(stream_id: int, path: str, extra: tuple[tuple[str, str], ...] = ()) -> bytes:
    headers = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "x"),
        ("content-type", "application/grpc"),
        *extra,
    ]
    block = hpack.Encoder().encode(headers)
    return frame(1, 0x4, stream_id, block) + frame(0, 0x1, stream_id, grpc_frame(b"x"))


async def _connection(
    handlers: dict[str, Callable[[bytes], Awaitable[bytes]]],
) -> tuple[H2Protocol, FakeTransport]:
    services = Services()
    for name, handler in handlers.items():
        services.add_unary("t.S", name, handler)
    app = GrpcAsgiApp(services, HealthState(), ("t.S",))
    proto = ConnectionSet(app, H2Settings(), H2Stats()).protocol()
    transport = FakeTransport()
    proto.connection_made(transport)  # type: ignore[arg-type]
    proto.data_received(PREFACE + frame(4, 0, 0, b""))
    return proto, transport


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not condition():
            await asyncio.sleep(0)


async def _echo(request: bytes) -> bytes:
    return request


async def test_a_suspended_call_does_not_hold_the_calls_after_it_on_a_fake_transport() -> None:
    release = asyncio.Event()

    async def waits(request: bytes) -> bytes:
        await release.wait()
        return request

    proto, transport = await _connection({"Waits": waits, "Echo": _echo})
    proto.data_received(
        _request(1, "/t.S/Waits") + _request(3, "/t.S/Echo") + _request(5, "/t.S/Echo")
    )
    await _until(lambda: _statuses(transport.data).keys() == {3, 5})
    assert list(proto.streams) == [1]
    release.set()
    await _until(lambda: 1 in _statuses(transport.data))
    assert set(_statuses(transport.data).values()) == {Code.OK}
    assert not proto.streams
    proto.connection_lost(None)  # its timer goes with it


async def test_a_deadline_cancels_only_its_call_on_a_fake_transport() -> None:
    cancelled: list[bytes] = []

    async def forever(request: bytes) -> bytes:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(request)
            raise
        return request

    proto, transport = await _connection({"Forever": forever, "Echo": _echo})
    proto.data_received(
        _request(1, "/t.S/Echo")
        + _request(3, "/t.S/Forever", (("grpc-timeout", "20m"),))
        + _request(5, "/t.S/Echo")
    )
    await _until(lambda: len(_statuses(transport.data)) == 3)
    assert _statuses(transport.data) == {1: Code.OK, 3: Code.DEADLINE_EXCEEDED, 5: Code.OK}
    assert cancelled == [b"x"]
    proto.connection_lost(None)


async def test_a_reset_cancels_only_its_call_on_a_fake_transport() -> None:
    cancelled = asyncio.Event()

    async def forever(request: bytes) -> bytes:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return request

    proto, transport = await _connection({"Forever": forever, "Echo": _echo})
    proto.data_received(_request(1, "/t.S/Forever") + _request(3, "/t.S/Echo"))
    await _until(lambda: 3 in _statuses(transport.data))
    proto.data_received(frame(3, 0, 1, (8).to_bytes(4, "big")))  # RST_STREAM(CANCEL)
    await _until(cancelled.is_set)
    proto.data_received(_request(5, "/t.S/Echo"))
    await _until(lambda: 5 in _statuses(transport.data))
    assert 1 not in _statuses(transport.data)
    assert not proto.streams
    proto.connection_lost(None)


async def test_trace_headers_do_not_reach_the_next_call_on_a_fake_transport() -> None:
    seen: list[tuple[str | None, str | None]] = []

    async def ignores(request: bytes) -> bytes:
        return request  # a handler without tracing leaves them unread

    async def reads(request: bytes) -> bytes:
        seen.append(incoming_trace_context())
        return request

    proto, transport = await _connection({"Ignores": ignores, "Reads": reads})
    proto.data_received(
        _request(1, "/t.S/Reads", (("traceparent", TRACEPARENT),))
        + _request(3, "/t.S/Ignores", (("traceparent", TRACEPARENT),))
        + _request(5, "/t.S/Reads")
    )
    await _until(lambda: len(_statuses(transport.data)) == 3)
    assert seen == [(TRACEPARENT, None), (None, None)]
    proto.connection_lost(None)
