"""The floor of the Envoy-based server: a raw ASGI gRPC no-op on pyvoy.

No adapter, no health, no routing: read the request body, send one fixed
framed answer and ``grpc-status: 0``. Whatever our services cost above this
is theirs (adapter + decision); below it nothing Python-based can go on
this server. Runs ``--workers`` pyvoy servers on one port (SO_REUSEPORT,
Envoy's default), one Envoy thread each, as our workers run.

    uv run python bench/asgi_noop.py --port 9400 --workers 1 --response-hex 0000000000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

_START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"application/grpc")],
    "trailers": True,
}
_TRAILERS = {"type": "http.response.trailers", "headers": [(b"grpc-status", b"0")]}
_BODY = {
    "type": "http.response.body",
    "body": bytes.fromhex(os.environ.get("NOOP_RESPONSE_HEX", "0000000000")),
    "more_body": False,
}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await receive()
    await send(_START)
    await send(_BODY)
    await send(_TRAILERS)


ROOT = Path(__file__).resolve().parents[1]


async def _main(args: argparse.Namespace) -> None:
    root = ROOT
    sys.path.insert(0, str(root))
    from meshplane.envoy_binary import ensure_envoy_api  # noqa: PLC0415
    from meshplane.servers.envoy.server import SITE_DIR  # noqa: PLC0415

    ensure_envoy_api()
    from pyvoy import PyvoyServer  # noqa: PLC0415

    path = os.pathsep.join([str(SITE_DIR), str(root / "bench"), os.environ.get("PYTHONPATH", "")])
    env = {"NOOP_RESPONSE_HEX": args.response_hex}
    servers = [
        PyvoyServer(
            "asgi_noop:app",
            port=args.port,
            lifespan=False,
            additional_envoy_args=["--concurrency", str(args.envoy_threads)],
            loop=args.loop,
            worker_threads=args.worker_threads,
            env={**env, "PYTHONPATH": path + os.pathsep + os.pathsep.join(sys.path)},
        )
        for _ in range(args.workers)
    ]
    for server in servers:
        await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (2, 15):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for server in servers:
        await server.stop()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--response-hex", default="0000000000", help="the framed answer")
    parser.add_argument(
        "--loop", choices=["uvloop", "asyncio"], default=None, help="pyvoy's loop (default uvloop)"
    )
    parser.add_argument("--envoy-threads", type=int, default=1)
    parser.add_argument(
        "--worker-threads", type=int, default=None, help="pyvoy's worker_threads (default 1)"
    )
    asyncio.run(_main(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
