"""``/metrics``, ``/healthz`` and ``/readyz`` of the agent (optional, ``--listen``).

Two metrics, from a registry of its own: the current certificate's expiry
(:data:`EXPIRY`) and the failed Sign calls (:data:`FAILURES`). ``/readyz``
is 200 while the agent holds an unexpired certificate: before that,
Envoy's listeners have nothing to serve mTLS with.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from sidecar_agent.certificates import KeeperMetrics
from sidecar_agent.identity import Issued

EXPIRY = "meshplane_sidecar_agent_certificate_expiry_timestamp_seconds"
FAILURES = "meshplane_sidecar_agent_sign_failures"


class StatusServer:
    """The endpoint's state and its HTTP server (a daemon thread)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.expiry = Gauge(EXPIRY, "notAfter of the workload certificate", registry=self.registry)
        self.failures = Counter(FAILURES, "Sign calls that failed", registry=self.registry)
        self.not_after = 0.0
        self._server: ThreadingHTTPServer | None = None

    def issued(self, issued: Issued) -> None:
        self.not_after = issued.not_after
        self.expiry.set(issued.not_after)

    def keeper_metrics(self) -> KeeperMetrics:
        return KeeperMetrics(issued=self.issued, failed=self.failures.inc)

    def answer(self, path: str, now: float) -> tuple[int, str, bytes]:
        """(status, content type, body) of a GET (pure but for the registry)."""
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)
        if path == "/healthz":
            return 200, "text/plain", b"ok\n"
        if path == "/readyz":
            ready = now < self.not_after
            return (200, "text/plain", b"ready\n") if ready else (503, "text/plain", b"no cert\n")
        return 404, "text/plain", b"not found\n"

    def start(self, host: str, port: int) -> int:
        status = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                code, kind, body = status.answer(self.path.partition("?")[0], time.time())
                self.send_response(code)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                del format, args

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return int(self._server.server_address[1])

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
