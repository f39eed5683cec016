"""A Microsoft-Graph-shaped HTTP server: a STAND-IN, because the real Graph cannot be reached here.

It implements only what directory sync uses, with Graph's shapes:

* ``POST /{tenant}/oauth2/v2.0/token`` (client credentials; checks id, secret
  and the ``https://.../.default``-style scope);
* ``GET /v1.0/users``, ``/v1.0/groups``, ``/v1.0/groups/{id}/members`` with a
  bearer token, ``$top`` paging and absolute ``@odata.nextLink`` URLs;
* scripted throttling: ``throttle(path_prefix, times, status, retry_after)``
  answers the next ``times`` matching requests with 429/503 and
  ``Retry-After``;
* ``break_path(prefix)`` makes matching requests fail with 500, and
  ``rogue_next_link`` makes the users listing point to another host.

It runs a real socket server (``ThreadingHTTPServer``) in a background
thread, and records every request for assertions.
"""

from __future__ import annotations

import json
import secrets
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support.net import free_port

TENANT = "test-tenant"
CLIENT_ID = "graph-sync-client"
CLIENT_SECRET = "graph-secret-for-tests-only"


@dataclass
class Throttle:
    prefix: str
    remaining: int
    status: int
    retry_after: str | None


@dataclass
class GraphState:
    users: list[dict[str, Any]] = field(default_factory=list)
    groups: list[dict[str, Any]] = field(default_factory=list)
    members: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    page_size: int = 2
    throttles: list[Throttle] = field(default_factory=list)
    broken_prefixes: set[str] = field(default_factory=set)
    rogue_next_link: bool = False
    tokens: set[str] = field(default_factory=set)
    requests: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class GraphStandIn:
    """The running stand-in; use as a context manager or call ``stop()``."""

    def __init__(self) -> None:
        self.state = GraphState()
        self.port = free_port()
        state = self.state
        base = f"http://127.0.0.1:{self.port}"

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _scripted(self, path: str) -> bool:
                with state.lock:
                    state.requests.append((self.command, self.path))
                    for t in state.throttles:
                        if path.startswith(t.prefix) and t.remaining > 0:
                            t.remaining -= 1
                            headers = {"Retry-After": t.retry_after} if t.retry_after else {}
                            self._send(
                                t.status,
                                {"error": {"code": "TooManyRequests", "message": "throttled"}},
                                headers,
                            )
                            return True
                    if any(path.startswith(p) for p in state.broken_prefixes):
                        self._send(500, {"error": {"code": "InternalServerError"}})
                        return True
                return False

            def do_POST(self) -> None:
                path = urlsplit(self.path).path
                if self._scripted(path):
                    return
                if path != f"/{TENANT}/oauth2/v2.0/token":
                    self._send(404, {"error": "not_found"})
                    return
                length = int(self.headers.get("Content-Length", "0"))
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
                if (
                    form.get("grant_type") != "client_credentials"
                    or form.get("client_id") != CLIENT_ID
                    or form.get("client_secret") != CLIENT_SECRET
                    or not form.get("scope", "").endswith("/.default")
                ):
                    self._send(401, {"error": "invalid_client"})
                    return
                token = secrets.token_urlsafe(16)
                with state.lock:
                    state.tokens.add(token)
                self._send(200, {"access_token": token, "token_type": "Bearer", "expires_in": 3599})

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                if self._scripted(parts.path):
                    return
                auth = self.headers.get("Authorization", "")
                if not auth.startswith("Bearer ") or auth[7:] not in state.tokens:
                    self._send(401, {"error": {"code": "InvalidAuthenticationToken"}})
                    return
                query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                segments = parts.path.strip("/").split("/")
                if segments[:2] == ["v1.0", "users"] and len(segments) == 2:
                    items = state.users
                elif segments[:2] == ["v1.0", "groups"] and len(segments) == 2:
                    items = state.groups
                elif (
                    segments[:2] == ["v1.0", "groups"]
                    and len(segments) == 4
                    and segments[3] == "members"
                ):
                    if segments[2] not in state.members:
                        self._send(404, {"error": {"code": "Request_ResourceNotFound"}})
                        return
                    items = state.members[segments[2]]
                else:
                    self._send(404, {"error": {"code": "BadRequest"}})
                    return
                top = min(int(query.get("$top", "100")), state.page_size)
                skip = int(query.get("$skiptoken", "0"))
                page = items[skip : skip + top]
                body: dict[str, Any] = {"value": page}
                if skip + top < len(items):
                    host = "http://evil.invalid" if state.rogue_next_link else base
                    select = query.get("$select", "")
                    body["@odata.nextLink"] = (
                        f"{host}{parts.path}?$select={select}&$top={top}&$skiptoken={skip + top}"
                    )
                self._send(200, body)

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_directory(
        self,
        users: list[dict[str, Any]],
        groups: list[dict[str, Any]],
        members: dict[str, list[str]],
    ) -> None:
        """Replace the directory; ``members`` maps a group id to user or group ids."""
        group_ids = {g["id"] for g in groups}
        with self.state.lock:
            self.state.users = users
            self.state.groups = groups
            self.state.members = {
                gid: [
                    {
                        "@odata.type": "#microsoft.graph.group"
                        if mid in group_ids
                        else "#microsoft.graph.user",
                        "id": mid,
                    }
                    for mid in mids
                ]
                for gid, mids in members.items()
            }

    def throttle(
        self, prefix: str, times: int, *, status: int = 429, retry_after: str | None = "1"
    ) -> None:
        with self.state.lock:
            self.state.throttles.append(Throttle(prefix, times, status, retry_after))

    def break_path(self, prefix: str) -> None:
        with self.state.lock:
            self.state.broken_prefixes.add(prefix)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> GraphStandIn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
