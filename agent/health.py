"""``/metrics``, ``/healthz`` and ``/readyz`` of the agent, on one small HTTP listener.

A few lines of asyncio instead of a web framework: three read-only GETs,
scraped every few seconds, in the agent's own event loop (so readiness is
the tunnel's live state, not a copy of it).

- ``/healthz``: 200 while the process runs (the liveness probe);
- ``/readyz``: 200 while the tunnel is connected, else 503 (an agent that
  cannot reach the management plane serves no diagnostics);
- ``/metrics``: the Prometheus text format.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST

from meshplane.netaddr import parse_listen


class HealthServer:
    def __init__(self, listen: str, render: Callable[[], bytes], ready: Callable[[], bool]) -> None:
        self.listen = listen
        self._render = render
        self._ready = ready
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> int:
        host, port = parse_listen(self.listen)
        self._server = await asyncio.start_server(self._handle, host, port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(10):
                head = await reader.readuntil(b"\r\n\r\n")
            method, _, rest = head.decode("latin-1").partition(" ")
            path = rest.partition(" ")[0].partition("?")[0]
            if method != "GET":
                status, body, ctype = "405 Method Not Allowed", b"GET only\n", "text/plain"
            elif path == "/metrics":
                status, body, ctype = "200 OK", self._render(), CONTENT_TYPE_LATEST
            elif path == "/healthz":
                status, body, ctype = "200 OK", b"ok\n", "text/plain"
            elif path == "/readyz":
                ready = self._ready()
                status = "200 OK" if ready else "503 Service Unavailable"
                body = b"ok\n" if ready else b"tunnel not connected\n"
                ctype = "text/plain"
            else:
                status, body, ctype = "404 Not Found", b"not found\n", "text/plain"
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode("latin-1")
                + body
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
