"""``GrpcAsgiApp.complete_unary`` (the h2 backend's entry for a request whose
body has all arrived) answers exactly what the ASGI path answers, and declines,
having done nothing, every request the ASGI path must serve itself.

In process, with a recording responder (no sockets): the same calls run through
real sockets on the h2 backend in ``test_transports.py`` and the deadline rules
in ``test_asgi_deadlines.py``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from meshplane.asgi_grpc import GrpcAsgiApp
from meshplane.grpc_wire import Code, RpcError, frame
from meshplane.rpc import HealthState, Services, incoming_trace_context

Answer = tuple[int, list[tuple[bytes, bytes]], bytes, list[tuple[bytes, bytes]] | None]


async def _echo(request: bytes) -> bytes:
    return request


async def _refuses(request: bytes) -> bytes:
    raise RpcError(Code.PERMISSION_DENIED, "no")


async def _breaks(request: bytes) -> bytes:
    raise ValueError("bug")


async def _sleeps(request: bytes) -> bytes:
    await asyncio.sleep(10)
    return request


async def _traced(request: bytes) -> bytes:
    traceparent, _ = incoming_trace_context()
    return (traceparent or "").encode()


def _app() -> GrpcAsgiApp:
    services = Services()
    for name, handler in (
        ("Echo", _echo),
        ("Refuses", _refuses),
        ("Breaks", _breaks),
        ("Sleeps", _sleeps),
        ("Traced", _traced),
    ):
        services.add_unary("t.S", name, handler)
    return GrpcAsgiApp(services, HealthState(), ("t.S",))


GRPC = [(b"content-type", b"application/grpc")]
TRACE = (b"traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")

# (case, method, path, headers, body): served by the entry.
SERVED = [
    ("ok", "POST", "/t.S/Echo", GRPC, frame(b"hello")),
    ("ok, a grpc+proto content type", "POST", "/t.S/Echo",
     [(b"content-type", b"application/grpc+proto")], frame(b"x")),
    ("rpc error", "POST", "/t.S/Refuses", GRPC, frame(b"")),
    ("unexpected exception", "POST", "/t.S/Breaks", GRPC, frame(b"")),
    ("deadline", "POST", "/t.S/Sleeps", [*GRPC, (b"grpc-timeout", b"2m")], frame(b"")),
    ("trace headers reach the handler", "POST", "/t.S/Traced", [*GRPC, TRACE], frame(b"")),
]  # fmt: skip
# Declined: the ASGI path answers these (415, UNIMPLEMENTED, INTERNAL, ...).
DECLINED = [
    ("not POST", "GET", "/t.S/Echo", GRPC, frame(b"x")),
    ("not gRPC", "POST", "/t.S/Echo", [(b"content-type", b"text/plain")], frame(b"x")),
    ("no content type", "POST", "/t.S/Echo", [], frame(b"x")),
    ("unknown method", "POST", "/t.S/Nope", GRPC, frame(b"x")),
    ("a streaming method", "POST", "/grpc.health.v1.Health/Watch", GRPC, frame(b"")),
    ("compressed flag", "POST", "/t.S/Echo", GRPC, b"\x01" + frame(b"x")[1:]),
    ("truncated message", "POST", "/t.S/Echo", GRPC, frame(b"hello")[:-1]),
    ("two messages", "POST", "/t.S/Echo", GRPC, frame(b"a") + frame(b"b")),
    ("no message", "POST", "/t.S/Echo", GRPC, b""),
    ("over the size limit", "POST", "/t.S/Echo", GRPC, frame(b"x" * (4 * 1024 * 1024 + 1))),
]  # fmt: skip


class RecordingResponder:
    """Keeps what the entry answers (a fake of the h2 stream)."""

    def __init__(self) -> None:
        self.answers: list[Answer] = []

    def respond(self, start: dict[str, Any], body: bytes, trailers: dict[str, Any] | None) -> None:
        self.answers.append(
            (
                start["status"],
                list(start["headers"]),
                body,
                None if trailers is None else list(trailers["headers"]),
            )
        )


async def _asgi_answer(
    app: GrpcAsgiApp, method: str, path: str, headers: list[Any], body: bytes
) -> Answer:
    """The ASGI path's messages, as one answer (Trailers-Only: no trailers)."""
    scope = {"type": "http", "method": method, "path": path, "headers": headers}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    data = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    trailers = [m for m in sent if m["type"] == "http.response.trailers"]
    return (
        start["status"],
        list(start["headers"]),
        data,
        list(trailers[0]["headers"]) if trailers else None,
    )


@pytest.mark.parametrize(
    ("method", "path", "headers", "body"),
    [case[1:] for case in SERVED],
    ids=[case[0] for case in SERVED],
)
async def test_the_entry_answers_what_the_asgi_path_answers_with_a_recording_responder(
    method: str, path: str, headers: list[Any], body: bytes
) -> None:
    app = _app()
    responder = RecordingResponder()
    call = app.complete_unary(method, path, headers, body, responder)
    assert call is not None
    await call
    assert responder.answers == [await _asgi_answer(app, method, path, headers, body)]
    assert app.in_flight.count == 0
    assert len(responder.answers) == 1


@pytest.mark.parametrize(
    ("method", "path", "headers", "body"),
    [case[1:] for case in DECLINED],
    ids=[case[0] for case in DECLINED],
)
async def test_the_entry_declines_what_only_the_asgi_path_serves_with_a_recording_responder(
    method: str, path: str, headers: list[Any], body: bytes
) -> None:
    app = _app()
    responder = RecordingResponder()
    assert app.complete_unary(method, path, [*headers, TRACE], body, responder) is None
    assert responder.answers == []
    assert app.in_flight.count == 0
    assert incoming_trace_context() == (None, None)  # nothing noted either


async def test_the_entrys_deadline_cancels_only_its_handler_with_a_recording_responder() -> None:
    app = _app()
    responder = RecordingResponder()
    headers = [*GRPC, (b"grpc-timeout", b"1m")]
    call = app.complete_unary("POST", "/t.S/Sleeps", headers, frame(b""), responder)
    assert call is not None
    await call
    ((_, start_headers, _, trailers),) = responder.answers
    assert trailers is None  # Trailers-Only
    assert (b"grpc-status", str(int(Code.DEADLINE_EXCEEDED)).encode()) in start_headers
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    assert len(app.deadlines) <= 1
