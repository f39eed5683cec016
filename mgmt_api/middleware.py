"""ASGI middleware: client address, authentication, request-body limit and checks,
Prometheus metrics, and the trailing-slash redirect.

The client address (:class:`ClientAddress`) is settled once, outermost, and
written into the ASGI scope's ``client``: throttling, the console's in-process
API calls and anything that logs ``request.client`` all see the same address.

Authentication (:class:`Authenticate`) runs before anything looks at a
request under ``/v2/``: an unauthenticated caller gets 401 whatever its path,
query or body, and learns nothing of the schema.

The body limit buffers at most ``max_bytes`` and answers 400 (the API's error
body) beyond that, whether or not the client sent Content-Length, so an
oversized or endless chunked body can never reach a handler or cost memory.

A buffered JSON body (``Content-Type: application/json``, ``+json``, or none
given) is then checked before any handler sees it (:func:`check_json_body`),
so what FastAPI would report as "There was an error parsing the body", or
store as given, is refused with a 400 that says what is wrong and where.
A body of another type passes through: its route either accepts that type
(the OAuth token endpoint takes a form) or refuses it naming the expected
``Content-Type`` (:func:`mgmt_api.app.validation_error`).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from email.message import Message as MimeHeader
from typing import Any

import anyio.to_thread
from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.responses import RedirectResponse
from starlette.routing import Match, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mgmt_api.domain.client_address import ForwardedHeader, Network, client_address
from mgmt_api.errors import ApiError, Code
from mgmt_api.schemas.base import CONTROL_CHARACTERS

Headers = list[tuple[bytes, bytes]]


async def send_error(send: Send, error: ApiError) -> None:
    body = json.dumps(error.body()).encode()
    headers: Headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    headers += [(k.lower().encode(), v.encode("latin-1")) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.http_status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


#: Deeper JSON than this is refused: no resource is nested half as deep, and
#: a deep enough document exhausts the parser's recursion (a 500) instead.
MAX_JSON_DEPTH = 64
# The one definition, which the OpenAPI publishes as each input string's pattern.
_CONTROL = re.compile(f"[{CONTROL_CHARACTERS}]")


def _path(parts: list[str | int]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or "body"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def check_json_body(body: bytes) -> ApiError | None:
    """Why a JSON request body is unacceptable, or None.

    Refused: bytes that are not UTF-8; text that is not JSON (or uses
    ``NaN``/``Infinity``, or repeats a key in one object, which different
    parsers resolve differently); nesting deeper than :data:`MAX_JSON_DEPTH`;
    a string or key holding a control character other than tab and newlines.
    The error names the field as the client wrote it (``cluster.description``).
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return ApiError(
            Code.INVALID_ARGUMENT,
            f"body: is not valid UTF-8 (byte {exc.start}); send JSON encoded as UTF-8",
            field="body",
        )
    try:
        doc = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except RecursionError:
        return _too_deep()
    except ValueError as exc:
        return ApiError(Code.INVALID_ARGUMENT, f"body: malformed JSON ({exc})", field="body")
    return _check_value(doc, [])


def _too_deep() -> ApiError:
    return ApiError(
        Code.INVALID_ARGUMENT,
        f"body: JSON nested deeper than {MAX_JSON_DEPTH} levels",
        field="body",
    )


def _check_value(value: Any, path: list[str | int]) -> ApiError | None:
    if len(path) > MAX_JSON_DEPTH:
        return _too_deep()
    if isinstance(value, str):
        found = _CONTROL.search(value)
        if found is not None:
            field = _path(path)
            return ApiError(
                Code.INVALID_ARGUMENT,
                f"{field}: contains the control character U+{ord(found.group()):04X}",
                field=field,
            )
    elif isinstance(value, dict):
        for key, item in value.items():
            error = _check_value(key, path) or _check_value(item, [*path, key])
            if error is not None:
                return error
    elif isinstance(value, list):
        for index, item in enumerate(value):
            error = _check_value(item, [*path, index])
            if error is not None:
                return error
    return None


def is_json_content(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether FastAPI will parse this request's body as JSON: a JSON media type, or none."""
    for name, value in headers:
        if name == b"content-type":
            header = MimeHeader()
            header["content-type"] = value.decode("latin-1")
            subtype = header.get_content_subtype()
            return header.get_content_maintype() == "application" and (
                subtype == "json" or subtype.endswith("+json")
            )
    return True


class Authenticate:
    """Authenticates every request under ``/v2/`` but the public ones, first.

    FastAPI checks path, query and body before an endpoint (or a dependency
    taking parameters) runs, and :class:`BodyLimit` checks the JSON before
    FastAPI: authenticating in the endpoint let an anonymous caller with a
    malformed body get the schema's 400 instead of a 401. Here nothing of the
    request but its path and headers has been read.

    ``authenticate(scope)`` raises :class:`ApiError` (401, or 429 when
    throttled) or leaves the call context in the scope for the routes
    (:func:`mgmt_api.routes.deps.call_context`). It may hash a password, so it
    runs in a worker thread. ``is_public(path)``: the login endpoints, which
    are how a caller gets credentials.
    """

    def __init__(
        self,
        app: ASGIApp,
        authenticate: Callable[[Scope], None],
        is_public: Callable[[str], bool],
    ) -> None:
        self.app = app
        self.authenticate = authenticate
        self.is_public = is_public

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self._guarded(scope["path"]):
            try:
                await anyio.to_thread.run_sync(self.authenticate, scope)
            except ApiError as error:
                await send_error(send, error)
                return
        await self.app(scope, receive, send)

    def _guarded(self, path: str) -> bool:
        return path.startswith("/v2/") and not self.is_public(path)


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
        if body and is_json_content(scope["headers"]):
            error = check_json_body(body)
            if error is not None:
                await send_error(send, error)
                return
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
        status = StatusCapture(send)
        try:
            await self.app(scope, receive, status)
        finally:
            template = route_template(scope)
            method = scope["method"] if scope["method"] in _METHODS else "OTHER"
            self.requests.labels(method, template, str(status.code)).inc()
            self.latency.labels(method, template).observe(time.perf_counter() - start)


_METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"})


class StatusCapture:
    """An ASGI ``send`` that remembers the response status (500 until one is
    sent, so an exception before the response counts as the error it becomes)."""

    def __init__(self, send: Send) -> None:
        self.code = 500
        self._send = send

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.code = int(message["status"])
        await self._send(message)


def route_template(scope: Scope) -> str:
    """The matched route's path template (bounded label values), or ``<unmatched>``."""
    route: Any = scope.get("route")
    return getattr(route, "path", None) or "<unmatched>"


class ClientAddress:
    """Puts the client's address in ``scope["client"]``: the peer, or the address
    trusted proxies forwarded (:func:`mgmt_api.domain.client_address.client_address`).

    The only place that reads ``X-Forwarded-For``/``Forwarded``. A replaced
    address carries port 0: the client's own port is not known.
    """

    def __init__(self, app: ASGIApp, trusted: tuple[Network, ...], header: ForwardedHeader) -> None:
        self.app = app
        self.trusted = trusted
        self.header = header
        self._name = header.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        peer = scope.get("client")
        if scope["type"] in ("http", "websocket") and peer:
            lines = [v.decode("latin-1") for n, v in scope["headers"] if n == self._name]
            address = client_address(str(peer[0]), lines, self.trusted, self.header)
            if address != peer[0]:
                scope = {**scope, "client": (address, 0)}
        await self.app(scope, receive, send)


def relative_slash_redirect(router: Router) -> None:
    """Make ``router`` redirect to the path with (or without) its trailing slash
    with a *relative* ``Location``.

    Starlette's own redirect builds an absolute URL from the request's
    ``Host`` header, which the client chooses: ``Host: evil.example`` got
    ``Location: http://evil.example/...``. This one sends the path (as the
    client encoded it) and query only, and never a path the browser would
    read as another host (``//host``, ``/\\host``).
    """
    router.redirect_slashes = False
    not_found = router.default

    async def default(scope: Scope, receive: Receive, send: Send) -> None:
        raw: bytes = scope.get("raw_path") or scope["path"].encode()
        path: str = scope["path"]
        if scope["type"] == "http" and path != "/" and raw[1:2] not in (b"/", b"\\"):
            other = path.rstrip("/") if path.endswith("/") else path + "/"
            if any(r.matches({**scope, "path": other})[0] is not Match.NONE for r in router.routes):
                location = raw.rstrip(b"/") if path.endswith("/") else raw + b"/"
                if scope.get("query_string"):
                    location += b"?" + scope["query_string"]
                response = RedirectResponse(location.decode("latin-1"), status_code=307)
                await response(scope, receive, send)
                return
        await not_found(scope, receive, send)

    router.default = default
