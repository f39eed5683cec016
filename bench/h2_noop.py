"""The h2 backend's floor: `bench/asgi_noop.py`'s raw ASGI no-op on meshplane's own HTTP/2 server.

``bench/asgi_noop.py`` is the floor of ``--server envoy`` (the same app on
pyvoy). This serves that very app through :mod:`meshplane.servers.h2.protocol` and
the pure core :mod:`meshplane.servers.h2.http2` with the backend's default settings, no
``GrpcAsgiApp`` and no service: what a call costs on ``--server h2`` before
any of our gRPC or service code. ``--workers`` spawned processes share the
port (SO_REUSEPORT), as the backend's workers do.

    uv run python bench/h2_noop.py --port 9401 --workers 1 --response-hex 0000000000
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _serve(port: int) -> None:
    """One worker: uvloop, the no-op behind the h2 protocol, until SIGTERM."""
    sys.path.insert(0, str(ROOT))
    import uvloop  # noqa: PLC0415

    from bench import asgi_noop  # noqa: PLC0415  (reads NOOP_RESPONSE_HEX at import)
    from meshplane.servers.h2.protocol import ConnectionSet, H2Settings, H2Stats  # noqa: PLC0415
    from meshplane.worker_support import reuseport_socket  # noqa: PLC0415

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        connections = ConnectionSet(asgi_noop.app, H2Settings(), H2Stats())
        sock = reuseport_socket(f"127.0.0.1:{port}")
        server = await loop.create_server(connections.protocol, sock=sock, backlog=1024)
        await stop.wait()
        server.close()
        connections.close_all()

    uvloop.run(main())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--response-hex", default="0000000000", help="the framed answer")
    args = parser.parse_args()
    os.environ["NOOP_RESPONSE_HEX"] = args.response_hex  # the spawned workers inherit it
    spawn = multiprocessing.get_context("spawn")
    workers = [spawn.Process(target=_serve, args=(args.port,)) for _ in range(args.workers)]
    for worker in workers:
        worker.start()
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not stopping and all(w.is_alive() for w in workers):
        time.sleep(0.2)
    for worker in workers:
        worker.terminate()
    for worker in workers:
        worker.join(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
