"""The console's client of the public ``/v2`` API, in the same process.

Every page is built from ``/v2`` calls made with the signed-in user's
session token as a bearer, so the console sees exactly what the user's
permissions allow and cannot do anything the API would refuse: RBAC,
validation, etags and audit all stay in the API. The calls go through the
whole ASGI application (middleware, routing, error handlers), not around
it, but without a socket: a call costs what the API's handler costs.

The caller's scheme, host and address are passed on, so what the API
derives from them (install-template URLs, the failed-login throttle by
client address) is what a direct call would get.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from starlette.types import ASGIApp, Message, Scope


@dataclass(frozen=True)
class Origin:
    """Where the browser's request came in: passed on to the API call."""

    scheme: str
    host_header: str
    server: tuple[str, int]
    client: tuple[str, int]


@dataclass(frozen=True)
class ApiResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class ApiCallError(Exception):
    """A ``/v2`` error: its status and the API's ``{code, message, details}``."""

    def __init__(  # noqa: PLR0917 - the fields of the API's error body
        self,
        status: int,
        message: str,
        reason: str = "",
        field: str | None = None,
        metadata: dict[str, str] | None = None,
        retry_after: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason
        self.field = field
        self.metadata = metadata or {}
        self.retry_after = retry_after

    @classmethod
    def from_response(cls, response: ApiResponse) -> ApiCallError:
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return cls(response.status, f"the API answered {response.status}")
        reason, metadata, field_path = "", {}, None
        for detail in body.get("details") or []:
            if not isinstance(detail, dict):
                continue
            if detail.get("reason"):
                reason = str(detail["reason"])
                metadata = {str(k): str(v) for k, v in (detail.get("metadata") or {}).items()}
            for violation in detail.get("fieldViolations") or []:
                field_path = field_path or str(violation.get("field") or "") or None
        return cls(
            response.status,
            str(body.get("message") or f"the API answered {response.status}"),
            reason,
            field_path,
            metadata,
            response.headers.get("retry-after"),
        )


class InProcessApi:
    """Calls the application it is mounted in, as an ASGI client."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def request(
        self,
        origin: Origin,
        method: str,
        path: str,
        *,
        authorization: str | None = None,
        params: Mapping[str, str] | None = None,
        json_body: Any = None,
        form: Mapping[str, str] | None = None,
    ) -> ApiResponse:
        headers: list[tuple[bytes, bytes]] = [(b"host", origin.host_header.encode("latin-1"))]
        body = b""
        if authorization:
            headers.append((b"authorization", authorization.encode("latin-1")))
        if json_body is not None:
            body = json.dumps(json_body).encode()
            headers.append((b"content-type", b"application/json"))
        elif form is not None:
            body = urlencode(form).encode()
            headers.append((b"content-type", b"application/x-www-form-urlencoded"))
        if body:
            headers.append((b"content-length", str(len(body)).encode()))
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": origin.scheme,
            "path": path,
            "raw_path": path.encode(),
            "query_string": urlencode(params or {}).encode(),
            "root_path": "",
            "headers": headers,
            "client": origin.client,
            "server": origin.server,
        }
        sent = False
        status = 500
        out_headers: dict[str, str] = {}
        chunks: list[bytes] = []

        async def receive() -> Message:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                for name, value in message.get("headers", []):
                    out_headers[name.decode("latin-1").lower()] = value.decode("latin-1")
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self._app(scope, receive, send)
        return ApiResponse(status, out_headers, b"".join(chunks))


class UserApi:
    """``/v2`` as one signed-in user sees it: raises :class:`ApiCallError` on errors."""

    def __init__(self, api: InProcessApi, origin: Origin, token: str) -> None:
        self._api = api
        self._origin = origin
        self._authorization = f"Bearer {token}"

    async def call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
    ) -> Any:
        response = await self._api.request(
            self._origin,
            method,
            path,
            authorization=self._authorization,
            params={k: v for k, v in (params or {}).items() if v not in ("", None)},
            json_body=body,
        )
        if response.status != 200:
            raise ApiCallError.from_response(response)
        return response.json()

    async def get(self, path: str, **params: str) -> Any:
        return await self.call("GET", path, params=params)

    async def raw(self, path: str) -> ApiResponse:
        """A GET whose body is passed through as it is (dashboard downloads)."""
        response = await self._api.request(
            self._origin, "GET", path, authorization=self._authorization
        )
        if response.status != 200:
            raise ApiCallError.from_response(response)
        return response

    async def permissions(self, path: str) -> frozenset[str]:
        """The user's permissions on the object at ``path`` (none if it cannot be read)."""
        try:
            body = await self.get(path + "/permissions")
        except ApiCallError:
            return frozenset()
        return frozenset(
            p for rule in body.get("rules") or [] for p in rule.get("permissions") or []
        )
