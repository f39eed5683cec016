"""The demo's upstream: a tiny HTTP/1.1 server behind the gateway (``scripts/run``).

The tour needs something for the gateway to route to whose answers show
what the gateway did: ``GET /headers`` echoes the request headers as JSON
(like httpbin, so the ``x-ratelimit-*`` headers and the ``authorization``
header Envoy forwarded are visible), ``/status/{code}`` answers that code,
``/slow?seconds=N`` holds the request N seconds (at most
:data:`MAX_SLOW_SECONDS`) so that a burst of them overflows the gateway's
circuit breakers (503), and ``/`` answers a short text.

It is the standard library's threading HTTP server: one thread per
connection, so slow requests do not hold up the others, and nothing to
install. Logs are JSON lines on stderr like every other process of the
stack; SIGTERM (or SIGINT) stops it cleanly with exit code 0.

    python -m demo.upstream --listen 127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import signal
import socket
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from meshplane.logging import configure_logging
from meshplane.netaddr import parse_listen

SERVICE = "demo-upstream"
MAX_SLOW_SECONDS = 30.0
_STATUS = re.compile(r"^/status/(\d{3})$")

log = logging.getLogger("demo.upstream")


class Handler(BaseHTTPRequestHandler):
    """Answers the four demo paths; everything else is a 404."""

    protocol_version = "HTTP/1.1"  # keep-alive, as Envoy's upstream connections expect
    server_version = "meshplane-demo-upstream"

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/headers":
            self._send(200, {"app": self.server.app_name, "headers": dict(self.headers.items())})  # type: ignore[attr-defined]
            return
        match = _STATUS.match(url.path)
        if match and 200 <= int(match.group(1)) <= 599:
            code = int(match.group(1))
            self._send(code, {"status": code})
            return
        if url.path == "/slow":
            seconds = _seconds(parse_qs(url.query).get("seconds", ["1"])[0])
            if seconds is None:
                self._send(400, {"error": "seconds must be a number"})
                return
            time.sleep(seconds)
            self._send(200, {"slept": seconds})
            return
        if url.path == "/":
            name = self.server.app_name  # type: ignore[attr-defined]
            self._send_text(200, f"meshplane demo {name}: try /headers, /status/418, /slow\n")
            return
        self._send(404, {"error": f"no such path: {url.path}"})

    def _send(self, code: int, body: object) -> None:
        self._send_bytes(code, json.dumps(body, indent=2).encode() + b"\n", "application/json")

    def _send_text(self, code: int, text: str) -> None:
        self._send_bytes(code, text.encode(), "text/plain; charset=utf-8")

    def _send_bytes(self, code: int, data: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        status = code.value if isinstance(code, HTTPStatus) else code
        log.info(
            "request",
            extra={
                "method": self.command,
                "path": self.path,
                "status": status,
                "peer": self.client_address[0],
            },
        )

    def log_message(self, format: str, *args: object) -> None:
        log.warning(format % args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a request still sleeping in /slow does not hold up the exit
    #: Who answers (``--name``): the mesh tour's workloads say which one a call reached.
    app_name = "upstream"


class _Server6(_Server):
    address_family = socket.AF_INET6


def _seconds(text: str) -> float | None:
    """``seconds`` bounded to [0, MAX_SLOW_SECONDS]; None when not a number."""
    try:
        value = float(text)
    except ValueError:
        return None
    if math.isnan(value):
        return None
    return min(max(value, 0.0), MAX_SLOW_SECONDS)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m demo.upstream", description=__doc__)
    parser.add_argument("--listen", default="127.0.0.1:8000", help="HOST:PORT to serve on")
    parser.add_argument(
        "--name", default="upstream", help="the app's name in its answers (the mesh workloads)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_logging(SERVICE)
    try:
        host, port = parse_listen(args.listen)
    except ValueError as exc:
        print(f"{SERVICE}: error: {exc}", file=sys.stderr)
        return 2
    server = (_Server6 if ":" in host else _Server)((host, port), Handler)
    server.app_name = args.name
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    worker = threading.Thread(target=server.serve_forever, name="serve", daemon=True)
    worker.start()
    log.info("serving", extra={"listen": args.listen})
    stop.wait()
    server.shutdown()
    server.server_close()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
