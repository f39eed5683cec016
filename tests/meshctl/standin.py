"""A STAND-IN for the management plane's OIDC endpoints, which are not wired yet.

``/v2/oidc/login`` and the platform token endpoint (``POST /v2/oidc/token``)
do not exist on the real server today (docs/identity.md: "The REST routes
are not wired yet"), and ``/v2/oidc/configuration`` answers
``enabled: false``. To test meshctl's side of the browser, device-code and
token-exchange logins end to end, this small HTTP server plays exactly
those three endpoints, with the contract meshctl documents in
``docs/meshctl.md``. Everything else (the provider, the platform token it
hands out, the API calls made with it) is real.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

TokenHandler = Callable[[dict[str, str]], tuple[int, dict[str, Any]]]


@dataclass
class StandIn:
    configuration: dict[str, Any] = field(default_factory=dict)
    # What /v2/oidc/login appends to redirectUri (the server's answer after the provider login).
    login_result: dict[str, str] = field(default_factory=dict)
    token_handler: TokenHandler | None = None
    token_requests: list[dict[str, str]] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> StandIn:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                if parts.path == "/v2/oidc/configuration":
                    self._json(200, standin.configuration)
                elif parts.path == "/v2/oidc/login":
                    target = query["redirectUri"]
                    sep = "&" if "?" in target else "?"
                    self.send_response(302)
                    self.send_header("Location", target + sep + urlencode(standin.login_result))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                else:
                    self._json(404, {"code": 5, "message": "Not Found", "details": []})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
                if urlsplit(self.path).path != "/v2/oidc/token" or standin.token_handler is None:
                    self._json(404, {"code": 5, "message": "Not Found", "details": []})
                    return
                standin.token_requests.append(form)
                status, body = standin.token_handler(form)
                self._json(status, body)

            def _json(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
