"""ASGI middleware: request-body limit and Prometheus request metrics.

The body limit buffers at most ``max_bytes`` and answers 400 (the API's error
body) beyond that, whether or not the client sent Content-Length, so an
oversized or endless chunked body can never reach a handler or cost memory.
"""

from __future__ import annotations

import json
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mgmt_api.errors import ApiError, Code

Headers = list[tuple[bytes, bytes]]


async def send_error(send: Send, error: ApiError) -> None:
    body = json.dumps(error.body()).encode()
    headers: Headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": error.http_status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        too_large = ApiError(
            Code.INVALID_ARGUMENT, f"request body larger than {self.max_bytes} bytes"
        )
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    if int(value) > self.max_bytes:
                        await send_error(send, too_large)
                        return
                except ValueError:
                    await send_error(
                        send, ApiError(Code.INVALID_ARGUMENT, "malformed Content-Length")
                    )
                    return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await send_error(send, too_large)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class Metrics:
    """Counts and times requests by method, route *template* and status.

    Labels are bounded: unmatched paths are reported as ``<unmatched>``, never
    the raw path, so scanners cannot blow up the series count.
    """

    def __init__(self, app: ASGIApp, registry: CollectorRegistry) -> None:
        self.app = app
        self.requests = Counter(
            "mgmt_api_http_requests_total",
            "HTTP requests handled",
            ["method", "route", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "mgmt_api_http_request_duration_seconds",
            "HTTP request latency",
            ["method", "route"],
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def capture(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            route: Any = scope.get("route")
            template = getattr(route, "path", None) or "<unmatched>"
            method = scope["method"] if scope["method"] in _METHODS else "OTHER"
            self.requests.labels(method, template, str(status)).inc()
            self.latency.labels(method, template).observe(time.perf_counter() - start)


_METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"})
