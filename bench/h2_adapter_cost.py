"""CPU per unary gRPC call through the h2 backend's connection, without sockets.

    uv run python bench/h2_adapter_cost.py [--calls 20000] [--batch 16] [--profile]

Drives :class:`meshplane.servers.h2.protocol.H2Protocol` on uvloop with a fake
transport (writes are counted, not sent): each batch is ``--batch`` unary
requests (HEADERS with h2load's kind of fully indexed block + one DATA with
END_STREAM) in one ``data_received``, then the loop turns until every answer
has been flushed. The app is the real :class:`meshplane.asgi_grpc.GrpcAsgiApp`
with a no-op handler, so the figure is the backend's own cost per call:
core + adapter + ASGI gRPC adapter + one task per call, no kernel. Compare
with ``bench/http2_core_cost.py`` (the core alone) to see the adapter's part.
``--profile`` prints the top functions (cProfile; slower, shares only).

``--service rls`` runs the real ShouldRateLimit handler instead (two
descriptors on the Redis store stack, its connection answering on the next
loop turn, as ``bench/asgi_cost.py``'s ``rls redis-2``): the h2 backend's
cost of a call that suspends once, plus the service's own.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import hpack
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from meshplane.asgi_grpc import GrpcAsgiApp
from meshplane.rpc import HealthState, Services
from meshplane.servers.h2.http2.connection import PREFACE, frame
from meshplane.servers.h2.protocol import ConnectionSet, H2Settings, H2Stats

PATH = "/bench.Noop/Call"
REQUEST = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", PATH),
    (":authority", "127.0.0.1"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
    ("grpc-timeout", "2000m"),
    ("user-agent", "h2load nghttp2/1.52.0"),
]
BODY = b"\x00\x00\x00\x00\x05hello"


class _CountingTransport:
    """A transport that counts what is written (uvloop's Transport is not subclassable)."""

    def __init__(self) -> None:
        self.written = 0
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)
        self.writes += 1

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 9000)}.get(
            name, default
        )

    def close(self) -> None: ...

    def abort(self) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


async def _noop_app() -> tuple[GrpcAsgiApp, list[tuple[str, str]], bytes, Any]:
    services = Services()

    async def noop(_: bytes) -> bytes:
        return b""

    services.add_unary("bench.Noop", "Call", noop)
    return GrpcAsgiApp(services, HealthState(), ("bench.Noop",)), REQUEST, BODY, None


async def _rls_app() -> tuple[GrpcAsgiApp, list[tuple[str, str]], bytes, Any]:
    """The rate-limit worker's app as ``bench/asgi_cost.py`` builds it (its fake Redis)."""
    from envoy.service.ratelimit.v3 import rls_pb2  # noqa: PLC0415

    from bench import asgi_cost  # noqa: PLC0415 - only this mode needs the services' stack
    from meshplane.server_contract import new_worker_context  # noqa: PLC0415
    from ratelimit.app import AppOptions, RateLimitApp  # noqa: PLC0415
    from ratelimit.settings import Settings  # noqa: PLC0415

    loop = asyncio.get_running_loop()
    loop.create_connection = asgi_cost.connect_fake_redis  # type: ignore[method-assign]  # a fake Redis, for this loop only
    workdir = Path(tempfile.mkdtemp(prefix="h2-rls-"))
    (workdir / "bench.yaml").write_text(asgi_cost.RLS_CONFIG)
    # No pipelining window: this loop turns with sleep(0) and would spin while
    # a held write waits for its timer, timing the spinning.
    settings = Settings(redis_pipeline_window=0.0)
    rls = RateLimitApp(
        AppOptions(str(workdir), redis_url="redis://127.0.0.1:6379/0", settings=settings)
    )
    ctx = new_worker_context(rls)
    await rls.start(ctx)
    request = rls_pb2.RateLimitRequest(domain="bench")
    for key, value in (("client", "c1"), ("route", "r1")):
        request.descriptors.add().entries.add(key=key, value=value)
    message = request.SerializeToString()
    body = b"\x00" + len(message).to_bytes(4, "big") + message
    headers = [(name, asgi_cost.RLS if name == ":path" else value) for name, value in REQUEST]

    async def stop() -> None:
        await rls.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    return GrpcAsgiApp(ctx.services, ctx.health, tuple(rls.service_names)), headers, body, stop


async def _run(
    calls: int, batch: int, service: str, profiler: cProfile.Profile | None = None
) -> tuple[float, float, int]:
    app, request, body, stop = await (_rls_app() if service == "rls" else _noop_app())
    owner = ConnectionSet(app, H2Settings(), H2Stats())
    proto = owner.protocol()
    transport = _CountingTransport()
    proto.connection_made(transport)  # type: ignore[arg-type]
    encoder = hpack.Encoder()
    proto.data_received(PREFACE + frame(4, 0, 0, b""))
    stream = 1
    batches = []
    for _ in range(calls // batch):
        chunk = []
        for _ in range(batch):
            block = encoder.encode(request)
            chunk.append(frame(1, 0x4, stream, block) + frame(0, 0x1, stream, body))
            stream += 2
        batches.append(b"".join(chunk))
    # Windows: the fake peer gives credit back for all our DATA at once.
    credit = frame(8, 0, 0, (1 << 30).to_bytes(4, "big"))
    proto.data_received(credit)
    if profiler is not None:
        profiler.enable()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for data in batches:
        proto.data_received(data)
        # The loop turns until the batch is answered and flushed (each turn is
        # what uvloop would do between reads; no timer is involved).
        while proto.streams or proto._flush_scheduled:  # noqa: ASYNC110
            await asyncio.sleep(0)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    if profiler is not None:
        profiler.disable()
    if stop is not None:
        await stop()
    return cpu, wall, transport.writes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=16, help="requests per read")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--service", choices=("noop", "rls"), default="noop")
    args = parser.parse_args()
    uvloop.run(_run(2000, args.batch, args.service))  # warm-up
    profiler = cProfile.Profile() if args.profile else None
    cpu, wall, writes = uvloop.run(_run(args.calls, args.batch, args.service, profiler))
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
    n = (args.calls // args.batch) * args.batch
    one, five, _ = os.getloadavg()
    print(
        f"{cpu / n * 1e6:.2f} µs CPU per call ({wall / n * 1e6:.2f} µs wall), "
        f"{writes} writes for {n} calls in batches of {args.batch}; load {one:.2f} {five:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
