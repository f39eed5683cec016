"""A real ext_authz worker on loopback ports, plus raw gRPC and HTTP clients.

The server runs ``meshplane.servers.h2.server.running`` in its own thread and event
loop, so tests (including hypothesis tests, which are synchronous) talk to it
through real sockets exactly like Envoy would.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.auth.v3 import attribute_context_pb2, external_auth_pb2, external_auth_pb2_grpc

from extauthz.app import ExtAuthzApp
from meshplane.servers.h2.server import running


class ServerThread:
    def __init__(self, app_factory: Callable[[], ExtAuthzApp]) -> None:
        self._factory = app_factory
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._error: BaseException | None = None
        self.port = 0
        self.http_port = 0
        self.app: ExtAuthzApp | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self.app = self._factory()
        async with running(
            self.app, "127.0.0.1:0", http_listen="127.0.0.1:0", grace_seconds=0.5
        ) as srv:
            self.port = srv.port
            self.http_port = srv.http_port or 0
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> ServerThread:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(15)

    def call_soon(self, fn: Callable[[], Any]) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(fn)


def app_factory(config: Path, **kwargs: Any) -> Callable[[], ExtAuthzApp]:
    return lambda: ExtAuthzApp(config, **kwargs)


def check_request(
    path: str,
    headers: dict[str, str] | None = None,
    *,
    policy: str | None = None,
    raw_headers: Iterable[tuple[str, bytes]] = (),
    method: str = "GET",
) -> external_auth_pb2.CheckRequest:
    """A CheckRequest shaped like Envoy's (lower-case keys, pseudo-headers)."""
    http = attribute_context_pb2.AttributeContext.HttpRequest(
        method=method, path=path, host="httpbin", scheme="http", protocol="HTTP/1.1"
    )
    all_headers = {":method": method, ":path": path, ":authority": "httpbin", **(headers or {})}
    raw = list(raw_headers)
    if raw:
        http.header_map.CopyFrom(
            base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v) for k, v in raw])
        )
    else:
        http.headers.update(all_headers)
    attributes = attribute_context_pb2.AttributeContext(
        request=attribute_context_pb2.AttributeContext.Request(http=http)
    )
    if policy is not None:
        attributes.context_extensions["meshplane.policy"] = policy
    return external_auth_pb2.CheckRequest(attributes=attributes)


@dataclass
class GrpcClient:
    port: int

    def __post_init__(self) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = external_auth_pb2_grpc.AuthorizationStub(self.channel)

    def check(self, request: external_auth_pb2.CheckRequest) -> external_auth_pb2.CheckResponse:
        response: external_auth_pb2.CheckResponse = self.stub.Check(request, timeout=10)
        return response

    def close(self) -> None:
        self.channel.close()


@dataclass
class HttpResult:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None


def http_check(port: int, target: str, headers: Iterable[tuple[str, str]] = ()) -> HttpResult:
    """Send one raw HTTP/1.1 request (bytes exactly as given) and parse the reply."""
    lines = [f"GET {target} HTTP/1.1", "host: extauthz", "connection: close"]
    lines += [f"{k}: {v}" for k, v in headers]
    data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    raw = b"".join(chunks)
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    parsed = [
        (k.strip().lower(), v.strip()) for k, _, v in (line.partition(":") for line in header_lines)
    ]
    return HttpResult(int(status_line.split()[1]), parsed, body)
