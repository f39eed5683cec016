"""A real HTTP server that serves JWKS documents, for rotation/outage tests.

Tiny on purpose (asyncio streams, HTTP/1.1, one request per connection) and
run in its own thread, so the server under test reaches it over loopback
exactly as it would reach an IdP. Tests change what it serves per path.
"""

from __future__ import annotations

import asyncio
import collections
import json
import threading
from typing import Any


class KeyServer:
    def __init__(self) -> None:
        self.documents: dict[str, Any] = {}
        self.status: dict[str, int] = {}
        self.delay: dict[str, float] = {}
        self.hits: collections.Counter[str] = collections.Counter()
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await reader.readline()
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass
            path = request_line.split()[1].decode()
            self.hits[path] += 1
            if self.delay.get(path):
                await asyncio.sleep(self.delay[path])
            status = self.status.get(path, 200)
            doc = self.documents.get(path)
            body = b"<html>not json</html>" if doc is None else json.dumps(doc).encode()
            writer.write(
                f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        finally:
            writer.close()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()

    def __enter__(self) -> KeyServer:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
