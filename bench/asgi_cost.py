"""CPU of one call through the ASGI gRPC adapter, Envoy and the kernel taken out.

    uv run python bench/asgi_cost.py [--count 20000] [--rounds 3]

The hot-path benches (``bench/extauthz/bench.py``, ``bench/ratelimit/run.py``)
measure whole servers, where the machine's load moves every figure by ±30%
and a change of a few microseconds of our Python is lost. This one calls the
very app pyvoy calls (``meshplane.asgi_grpc.GrpcAsgiApp`` with the services'
real handlers, on uvloop) in a tight loop, with a prebuilt ``scope`` that
carries ``grpc-timeout`` as Envoy's filters send it, and ``receive``/``send``
that answer at once:

* ``asgi-noop``: ``bench/asgi_noop.py``'s app: what the loop itself costs;
* ``check hs256`` / ``check forged``: ext_authz Check, a valid HS256 token (a
  token-cache hit) and a forged one repeated (a kept refusal);
* ``rls redis-2``: ShouldRateLimit, two descriptors, on the real Redis store
  stack whose connection answers each EVALSHA on the next loop turn (as
  ``bench/ratelimit/python_cost.py``); ``rls over-limit``: an empty bucket,
  answered by the local cache.

Figures are process CPU µs per call, the median of the rounds (then their
minimum and maximum, the spread the machine's load gave): a lower bound
of the cost in a worker (docs/benchmarks.md), for comparing revisions.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop
from envoy.service.ratelimit.v3 import rls_pb2

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import asgi_noop  # noqa: E402
from bench.extauthz.bench import check_request, grpc_frame, write_config  # noqa: E402
from bench.fake_redis import fake_connection  # noqa: E402
from extauthz.app import ExtAuthzApp  # noqa: E402
from meshplane.asgi_grpc import GrpcAsgiApp  # noqa: E402
from meshplane.server_contract import new_worker_context  # noqa: E402
from ratelimit.app import AppOptions, RateLimitApp  # noqa: E402

CHECK = "/envoy.service.auth.v3.Authorization/Check"
RLS = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
RLS_CONFIG = """\
domain: bench
descriptors:
  - key: client
    rate_limit: {unit: hour, requests_per_unit: 4000000000}
  - key: route
    rate_limit: {unit: hour, requests_per_unit: 4000000000}
  - key: blocked
    rate_limit: {unit: hour, requests_per_unit: 1}
"""


class _NextTurnRedis(asyncio.Transport):
    """Answers each command on the next loop turn: PONG, or the decide script's
    reply (counters at 5, or at the limit when it is that small) for fixed-window
    buckets, read from the script's ARGV layout (``ratelimit.store.redis.DECIDE_SCRIPT``).

    The reply to a write depends on all of it but its last argument (a decide
    call's clock), so it is worked out once per such prefix: the fake's own
    parsing is not timed as the service's cost on every call."""

    def __init__(self, protocol: asyncio.Protocol) -> None:
        super().__init__()
        self._protocol = protocol
        self._loop = asyncio.get_running_loop()
        self._replies: dict[bytes, bytes] = {}

    def write(self, data: bytes | bytearray | memoryview) -> None:
        data = bytes(data)
        key = data[: data.rfind(b"$")]
        out = self._replies.get(key)
        if out is None:
            if len(self._replies) >= 1024:
                self._replies.clear()
            out = self._replies[key] = _replies(data)
        self._loop.call_soon(self._protocol.data_received, out)

    def close(self) -> None:
        return None

    def abort(self) -> None:
        return None

    def is_closing(self) -> bool:
        return False


def _replies(data: bytes) -> bytes:
    """What Redis would answer to ``data`` (see :class:`_NextTurnRedis`)."""
    out = b""
    for command in data.split(b"*")[1:]:
        args = command.split(b"\r\n")[2::2]
        if not args:
            continue
        if args[0] == b"PING":
            out += b"+PONG\r\n"
            continue
        argv = args[3 + int(args[2]) :]  # 5 values per bucket, then the clock
        limits = [int(argv[5 * i]) for i in range((len(argv) - 1) // 5)]
        counts = [min(5, limit) for limit in limits]
        allowed = all(limit - c >= 1 for limit, c in zip(limits, counts, strict=True))
        out += b"*%d\r\n:%d\r\n" % (len(counts) + 1, allowed)
        out += b"".join(b":%d\r\n" % c for c in counts)
    return out


def _scope(path: str) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": [
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
            (b"grpc-timeout", b"1S"),
            (b"user-agent", b"h2load nghttp2/1.52.0"),
        ],
    }


async def _per_call(app: Any, path: str, body: bytes, count: int) -> float:
    scope = _scope(path)
    message = {"type": "http.request", "body": body, "more_body": False}

    async def receive() -> dict[str, Any]:
        return message

    statuses: set[bytes] = set()

    async def check(sent: dict[str, Any]) -> None:
        for key, value in sent.get("headers") or sent.get("trailers") or ():
            if key == b"grpc-status":
                statuses.add(value)

    async def send(_: dict[str, Any]) -> None:
        return None

    await app(scope, receive, check)
    if statuses - {b"0"}:  # a figure of a failing call would measure its error path
        raise SystemExit(f"{path} answered grpc-status {sorted(statuses)}: fix the bench")
    for _ in range(500):  # warm the caches (tokens, plans, templates, the connection)
        await app(scope, receive, send)
    start = time.process_time()
    for _ in range(count):
        await app(scope, receive, send)
    return (time.process_time() - start) / count * 1e6


#: ``loop.create_connection`` for a loop whose Redis is :class:`_NextTurnRedis`
#: (shared with the other CPU benches of the store's path).
connect_fake_redis = fake_connection(_NextTurnRedis)


async def _round(count: int) -> dict[str, float]:
    results: dict[str, float] = {}
    workdir = Path(tempfile.mkdtemp(prefix="asgi-cost-"))
    config, tokens = write_config(workdir, 10_000)
    bodies = {
        name: grpc_frame(check_request(tokens[token], None).SerializeToString())
        for name, token in (("check hs256", "hs"), ("check forged", "forged"))
    }
    results["asgi-noop"] = await _per_call(asgi_noop.app, "/x", bodies["check hs256"], count)
    ext = ExtAuthzApp(str(config))
    ctx = new_worker_context(ext)
    await ext.start(ctx)
    app = GrpcAsgiApp(ctx.services, ctx.health, tuple(ext.service_names))
    for name, body in bodies.items():
        results[name] = await _per_call(app, CHECK, body, count)
    await ext.stop()

    loop = asyncio.get_running_loop()
    loop.create_connection = connect_fake_redis  # type: ignore[method-assign]  # a fake Redis, for this loop only
    (workdir / "rls").mkdir()
    (workdir / "rls/bench.yaml").write_text(RLS_CONFIG)
    rls = RateLimitApp(AppOptions(str(workdir / "rls"), redis_url="redis://127.0.0.1:6379/0"))
    ctx = new_worker_context(rls)
    await rls.start(ctx)
    app = GrpcAsgiApp(ctx.services, ctx.health, tuple(rls.service_names))
    for name, entries in (
        ("rls redis-2", (("client", "c1"), ("route", "r1"))),
        ("rls over-limit", (("blocked", "b"),)),
    ):
        request = rls_pb2.RateLimitRequest(domain="bench")
        for key, value in entries:
            request.descriptors.add().entries.add(key=key, value=value)
        body = grpc_frame(request.SerializeToString())
        results[name] = await _per_call(app, RLS, body, count)
    await rls.stop()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rounds = [uvloop.run(_round(args.count)) for _ in range(args.rounds)]
    print(f"{'case':<20} {'CPU µs/call':>12} {'min':>7} {'max':>7}")
    for name in rounds[0]:
        figures = [r[name] for r in rounds]
        median = statistics.median(figures)
        print(f"{name:<20} {median:>12.1f} {min(figures):>7.1f} {max(figures):>7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
