"""A small HTTP/1.1 server on asyncio, with TLS from a reloading context and a clean drain.

The webhook answers a handful of routes to one client (the API server), so
a few dozen lines of asyncio give full control over what matters here: a
cap on every header block and body (read before anything else is done with
the request), a timeout on every read, keep-alive (the API server reuses
connections), and a drain on SIGTERM that stops accepting, lets requests in
progress finish and closes idle connections. Bad requests get a JSON
``{code, message, details}`` with a 4xx status; nothing here answers 5xx
for a client's fault, and a handler's own failure is a logged 500, never an
unanswered request.

With a TLS context that requires client certificates, a client without one
the CA signed never gets past the handshake; ``client_allowed`` can narrow
that to certain names (:func:`peer_names`): any other client is answered
403 and the connection closed, before its request is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

log = logging.getLogger(__name__)

#: Largest request line plus headers.
MAX_HEAD_BYTES = 16 * 1024
READ_TIMEOUT_SECONDS = 10.0
IDLE_TIMEOUT_SECONDS = 60.0
DRAIN_SETTLE_SECONDS = 0.1


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: Mapping[str, str]  # lower-case names
    body: bytes


@dataclass(frozen=True)
class Response:
    status: int
    content_type: str
    body: bytes

    @staticmethod
    def json(status: int, doc: object) -> Response:
        return Response(status, "application/json", json.dumps(doc).encode() + b"\n")

    @staticmethod
    def text(status: int, text: str) -> Response:
        return Response(status, "text/plain; charset=utf-8", text.encode() + b"\n")


Handler = Callable[[Request], Response]
#: Whether the names of a client's verified certificate (:func:`peer_names`) may call.
ClientCheck = Callable[[frozenset[str]], bool]
#: Told of each request the server itself refused (path, status), for metrics.
RefusalHook = Callable[[str, int], None]


@dataclass(frozen=True)
class Route:
    method: str
    handler: Handler


class _Refused(Exception):
    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.field = status, message, field

    def response(self) -> Response:
        details = {"field": self.field} if self.field else {}
        code = HTTPStatus(self.status).name
        return Response.json(
            self.status, {"code": code, "message": self.message, "details": details}
        )


def peer_names(peercert: Any) -> frozenset[str]:
    """The subject common names and DNS names of a verified peer certificate
    (:meth:`ssl.SSLSocket.getpeercert`'s dict); empty without one."""
    if not isinstance(peercert, dict):
        return frozenset()
    names = {
        value for rdn in peercert.get("subject", ()) for key, value in rdn if key == "commonName"
    }
    names.update(value for kind, value in peercert.get("subjectAltName", ()) if kind == "DNS")
    return frozenset(names)


def _target(request_line: bytes) -> str:
    """The path of a request line, or "" when it has none."""
    parts = request_line.split(b" ")
    return parts[1].partition(b"?")[0].decode("latin-1") if len(parts) == 3 else ""


class HttpServer:
    """Serves ``routes`` (path -> :class:`Route`) on one listener."""

    def __init__(
        self,
        name: str,
        routes: Mapping[str, Route],
        *,
        max_body: int,
        tls: ssl.SSLContext | None = None,
        on_refused: RefusalHook | None = None,
        client_allowed: ClientCheck | None = None,
    ) -> None:
        self.name = name
        self._routes = routes
        self._max_body = max_body
        self._tls = tls
        self._on_refused = on_refused
        self._client_allowed = client_allowed
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.StreamWriter, bool] = {}  # writer -> busy
        self._draining = False
        self._idle = asyncio.Event()  # set whenever no request is in progress
        self._idle.set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(
            self._connection, host, port, ssl=self._tls, limit=MAX_HEAD_BYTES
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def drain(self, grace: float) -> None:
        """Stop accepting, let requests in progress finish (``grace`` seconds), close the rest."""
        self._draining = True
        if self._server is not None:
            self._server.close()
        deadline = time.monotonic() + grace
        # A request whose bytes had already arrived when the signal came is read
        # (and so counted as in progress) before idle connections are closed.
        await asyncio.sleep(DRAIN_SETTLE_SECONDS)
        if any(self._connections.values()):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self._idle.wait()
        for writer in list(self._connections):
            writer.close()
        if self._tasks:  # let each connection's handler finish its own close
            await asyncio.wait(list(self._tasks), timeout=max(0.5, deadline - time.monotonic()))
        if self._server is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(max(0.1, deadline - time.monotonic())):
                    await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections[writer] = False
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        try:
            if not self._client_ok(writer):
                refused = _Refused(403, "this client certificate may not call the webhook")
                await self._send(writer, refused.response(), False)
                return
            while not self._draining:
                if not await self._one(reader, writer):
                    break
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError, TimeoutError):
            pass  # the client went away or stalled: nothing to answer
        finally:
            self._busy(writer, False)
            self._connections.pop(writer, None)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _client_ok(self, writer: asyncio.StreamWriter) -> bool:
        if self._client_allowed is None:
            return True
        names = peer_names(writer.get_extra_info("peercert"))
        if self._client_allowed(names):
            return True
        log.warning("client certificate refused", extra={"names": sorted(names)[:5]})
        return False

    def _busy(self, writer: asyncio.StreamWriter, busy: bool) -> None:
        self._connections[writer] = busy
        if any(self._connections.values()):
            self._idle.clear()
        else:
            self._idle.set()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; False when the connection is to be closed."""
        try:
            async with asyncio.timeout(IDLE_TIMEOUT_SECONDS):
                first = await reader.readuntil(b"\r\n")
        except asyncio.IncompleteReadError:
            return False
        except asyncio.LimitOverrunError:
            await self._send(writer, _Refused(414, "request line too long").response(), False)
            return False
        self._busy(writer, True)
        try:
            request, keep_alive = await self._read(first, reader)
            response = self._dispatch(request)
        except _Refused as refused:
            request, keep_alive, response = None, False, refused.response()
            if self._on_refused is not None:
                self._on_refused(_target(first), refused.status)
        except Exception as exc:  # a handler's bug: answered, logged by type only
            log.error(
                "request failed", extra={"path": _target(first)[:100], "error": type(exc).__name__}
            )
            request, keep_alive = None, False
            response = _Refused(500, "the request failed; see the injector's log").response()
        keep_alive = keep_alive and not self._draining
        await self._send(writer, response, keep_alive)
        self._busy(writer, False)
        return keep_alive and request is not None

    async def _read(self, first: bytes, reader: asyncio.StreamReader) -> tuple[Request, bool]:
        parts = first.decode("latin-1").rstrip("\r\n").split(" ")
        if len(parts) != 3 or parts[2] not in ("HTTP/1.1", "HTTP/1.0"):
            raise _Refused(400, "malformed request line")
        method, target, version = parts
        headers: dict[str, str] = {}
        async with asyncio.timeout(READ_TIMEOUT_SECONDS):
            size = len(first)
            while True:
                try:
                    line = (await reader.readuntil(b"\r\n")).decode("latin-1")[:-2]
                except asyncio.LimitOverrunError:
                    line, size = "", MAX_HEAD_BYTES + 1
                size += len(line) + 2
                if size > MAX_HEAD_BYTES:
                    raise _Refused(431, f"headers larger than {MAX_HEAD_BYTES} bytes")
                if not line:
                    break
                self._header(headers, line)
        body = await self._body(headers, reader)
        connection = headers.get("connection", "").lower()
        keep_alive = version == "HTTP/1.1" and connection != "close"
        return Request(method, target.partition("?")[0], headers, body), keep_alive

    @staticmethod
    def _header(headers: dict[str, str], line: str) -> None:
        name, sep, value = line.partition(":")
        name = name.strip().lower()
        if not sep or not name:
            raise _Refused(400, "malformed header line")
        if name in headers and name in ("content-length", "content-type", "host"):
            raise _Refused(400, f"{name} given twice", name)
        headers[name] = value.strip()

    async def _body(self, headers: Mapping[str, str], reader: asyncio.StreamReader) -> bytes:
        if "transfer-encoding" in headers:
            raise _Refused(411, "send the body with a Content-Length", "Transfer-Encoding")
        text = headers.get("content-length", "0")
        if not text.isdigit():
            raise _Refused(400, "Content-Length must be a number", "Content-Length")
        length = int(text)
        if length > self._max_body:
            raise _Refused(413, f"the body is larger than {self._max_body} bytes", "Content-Length")
        if not length:
            return b""
        async with asyncio.timeout(READ_TIMEOUT_SECONDS):
            return await reader.readexactly(length)

    def _dispatch(self, request: Request) -> Response:
        route = self._routes.get(request.path)
        if route is None:
            raise _Refused(404, f"no route {request.path[:100]}")
        if request.method != route.method:
            raise _Refused(405, f"{route.method} only", "method")
        return route.handler(request)

    async def _send(
        self, writer: asyncio.StreamWriter, response: Response, keep_alive: bool
    ) -> None:
        reason = HTTPStatus(response.status).phrase
        head = (
            f"HTTP/1.1 {response.status} {reason}\r\n"
            f"Content-Type: {response.content_type}\r\n"
            f"Content-Length: {len(response.body)}\r\n"
            f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
        )
        writer.write(head.encode("latin-1") + response.body)
        await writer.drain()
