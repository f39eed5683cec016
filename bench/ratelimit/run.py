"""Bench of ShouldRateLimit with h2load over h2c (Debian ``nghttp2-client``).

In one run, interleaved over ``--rounds`` rounds, at each worker count
(``bench/h2grpc.py`` explains the method and the floors):

* ``envoy-direct``: Envoy's ``direct_response`` (no Python): the native limit;
* ``asgi-noop``: a raw ASGI no-op on pyvoy: the floor of our default server;
* ``redis-2``: ``ratelimit serve`` (Envoy-based server) on a real
  redis-server, 2 descriptors (two buckets, one script call, default
  settings: pipelining and the local cache on);
* ``over-limit``: the same server, a bucket already empty, so the local cache
  of empty buckets answers;
* ``redis-2-h2``: ``ratelimit serve --server h2`` (meshplane's own one-thread
  HTTP/2 server), 2 descriptors.

Every case runs against the bench's own redis-server (started here, stopped
at the end) with the same ``--store-timeout-ms`` (default 1000 ms, not the
service's 10 ms, so a loaded machine slows the figures instead of stopping
the run), and each server's answer is checked, with retries for up to a
minute, before anything is measured.

Limits are huge (4e9 an hour) so the measured buckets never run out. After
the rounds, Redis commands per call are counted for our cases (``INFO
commandstats``, reset before a fixed 2,000-call run; the script's inner
commands included).

    uv run python bench/ratelimit/run.py                  # 1 and 2 workers, 2 rounds
    uv run python bench/ratelimit/run.py --workers 1 --rounds 1 --duration 2
    uv run python bench/ratelimit/run.py --workers 1 --gateway-like 1000
"""

from __future__ import annotations

import argparse
import contextlib
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

import grpc
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import h2grpc, tracing_cases
from bench.h2grpc import BIN, Run, Target, asgi_noop, envoy_direct, h2_noop
from tests.support.redis_server import RedisServer, redis_server

PATH = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
_HUGE = 4_000_000_000
CONFIG = f"""\
domain: bench
descriptors:
  - key: client
    rate_limit: {{unit: hour, requests_per_unit: {_HUGE}}}
  - key: route
    rate_limit: {{unit: hour, requests_per_unit: {_HUGE}}}
  - key: blocked
    rate_limit: {{unit: hour, requests_per_unit: 1}}
"""
#: How long the sanity check before measuring retries (a loaded machine).
SANITY_SECONDS = 60.0
_IGNORED_COMMANDS = {"info", "ping", "config", "command", "client", "hello", "select"}


def rls_request(*entries: tuple[str, str]) -> rls_pb2.RateLimitRequest:
    req = rls_pb2.RateLimitRequest(domain="bench")
    for key, value in entries:
        req.descriptors.add().entries.add(key=key, value=value)
    return req


def grpc_frame(body: bytes) -> bytes:
    return struct.pack(">BI", 0, len(body)) + body


REQUESTS = {
    "redis-2": rls_request(("client", "c1"), ("route", "r1")),
    "over-limit": rls_request(("blocked", "b")),
}
NOOP_ANSWER = rls_pb2.RateLimitResponse(
    overall_code=rls_pb2.RateLimitResponse.OK,
    statuses=[rls_pb2.RateLimitResponse.DescriptorStatus(code=1)] * 2,
).SerializeToString()


def check_answer(port: int, case: str, deadline: float = SANITY_SECONDS) -> None:
    """The case answers what it should (the over-limit bucket is emptied here).

    A loaded machine can make a first call fail (a worker still warming up,
    Redis slow to answer): it is retried until ``deadline`` seconds have
    passed, and only a wrong answer (or no right one by then) stops the bench.
    """
    want = "OVER_LIMIT" if case == "over-limit" else "OK"
    give_up = time.monotonic() + deadline
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        while True:
            try:
                for _ in range(2):
                    response = stub.ShouldRateLimit(REQUESTS[case], timeout=10)
                break
            except grpc.RpcError as exc:
                if time.monotonic() > give_up:
                    raise SystemExit(f"{case}: no answer within {deadline:g} s: {exc}") from exc
                time.sleep(0.5)
    if rls_pb2.RateLimitResponse.Code.Name(response.overall_code) != want:
        raise SystemExit(f"{case}: unexpected answer {response}")


def redis_commands(redis: RedisServer) -> int:
    stats = redis.command("info", "commandstats")
    return sum(
        int(m[2])
        for m in re.finditer(r"cmdstat_([a-z|]+):calls=(\d+)", stats)
        if m[1] not in _IGNORED_COMMANDS
    )


def _redis_stat(redis: RedisServer, name: str) -> int:
    match = re.search(rf"^{name}:(\d+)", redis.command("info", "stats"), re.MULTILINE)
    return int(match[1]) if match else 0


def commands_per_call(
    redis: RedisServer, server: h2grpc.Server, body: Path, calls: int = 2000
) -> tuple[float, float, int, list[float]]:
    """(Redis commands per call, Redis read events per call, client connections,
    each busy process's share of the server's CPU).

    Read events are the socket reads Redis did: one per batch a client wrote,
    so commands per read is the pipelining that was achieved; the CPU shares
    say how evenly SO_REUSEPORT spread h2load's connections over the workers
    (the two-worker question of issue 26).
    """
    port = server.port
    cpu = {pid: h2grpc.cpu_seconds([pid]) for pid in server.pids}
    redis.command("config", "resetstat")
    reads = _redis_stat(redis, "total_reads_processed")
    subprocess.run(
        ["h2load", "-n", str(calls), "-c", "4", "-m", "8", "-d", str(body), "-H",
         "content-type: application/grpc", "-H", "te: trailers",
         f"http://127.0.0.1:{port}{PATH}"],
        capture_output=True,
        check=True,
    )  # fmt: skip
    reads = _redis_stat(redis, "total_reads_processed") - reads
    clients = redis.command("client", "list").count("cmd=") - 1  # less our own
    used = [h2grpc.cpu_seconds([pid]) - before for pid, before in cpu.items()]
    shares = sorted(
        (u / sum(used) for u in used if sum(used) and u / sum(used) > 0.05), reverse=True
    )
    return redis_commands(redis) / calls, reads / calls, clients, shares


def ours(
    config: Path,
    redis: RedisServer,
    workers: int,
    server: str,
    extra: tuple[str, ...] = (),
    *,
    store_timeout_ms: float,
) -> contextlib.AbstractContextManager[h2grpc.Server]:
    """``ratelimit serve`` on ``redis``; every case gets the same store timeout
    (the 10 ms default times out on a starved machine: see ``--store-timeout-ms``)."""
    return h2grpc.listening(
        f"ours-{server}",
        [str(BIN / "ratelimit"), "serve", "--config", str(config), "--workers", str(workers),
         "--server", server, "--redis-url", redis.url,
         "--store-timeout-ms", str(store_timeout_ms), *extra],
    )  # fmt: skip


def bench_workers(
    workers: int, workdir: Path, args: argparse.Namespace, redis: RedisServer
) -> list[Run]:
    config = workdir / "bench.yaml"
    config.write_text(CONFIG)
    bodies = {}
    for case, request in REQUESTS.items():
        bodies[case] = workdir / f"{case}.bin"
        bodies[case].write_bytes(grpc_frame(request.SerializeToString()))
    answer = grpc_frame(NOOP_ANSWER)
    print(f"workers={workers}", flush=True)
    redis.command("flushall")
    with contextlib.ExitStack() as stack:
        direct = stack.enter_context(envoy_direct(workers, answer, workdir))
        noop = stack.enter_context(asgi_noop(workers, answer))
        timeout = args.store_timeout_ms
        envoy = stack.enter_context(ours(config, redis, workers, "envoy", store_timeout_ms=timeout))
        servers = [envoy]
        targets = [
            *h2grpc.floors(direct, noop, PATH, bodies["redis-2"]),
            Target("redis-2", envoy, PATH, bodies["redis-2"]),
        ]
        if not args.tracing:
            h2 = stack.enter_context(ours(config, redis, workers, "h2", store_timeout_ms=timeout))
            h2noop = stack.enter_context(h2_noop(workers, answer))
            servers += [h2]
            targets += [
                Target("over-limit", envoy, PATH, bodies["over-limit"], latency=False),
                Target("redis-2-h2", h2, PATH, bodies["redis-2"]),
                Target("h2-noop", h2noop, PATH, bodies["redis-2"]),
            ]
        for server in servers:
            for case in REQUESTS:
                check_answer(server.port, case)
        if args.tracing:
            # Only the floors and redis-2 off / 1% / 100% (issue 27's three cases).
            sink = stack.enter_context(tracing_cases.receiver())
            for case, ratio in tracing_cases.RATIOS.items():
                extra = tuple(tracing_cases.flags(sink, ratio))
                server = stack.enter_context(
                    ours(config, redis, workers, "envoy", extra, store_timeout_ms=timeout)
                )
                check_answer(server.port, "redis-2")
                targets.append(Target(f"redis-2-{case}", server, PATH, bodies["redis-2"], False))
        results = h2grpc.rounds(targets, workers, args, workdir)
        if args.tracing:
            print(f"  {tracing_cases.exported(sink)}", flush=True)
            return results
        for case in ("redis-2", "over-limit"):
            per_call, reads, clients, shares = commands_per_call(redis, envoy, bodies[case])
            print(
                f"  {case:<22} Redis commands per call: {per_call:.2f}, "
                f"Redis reads per call: {reads:.2f}, client connections: {clients}, "
                f"CPU shares of the busy processes: {', '.join(f'{x:.2f}' for x in shares)}",
                flush=True,
            )
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    h2grpc.add_arguments(parser)
    parser.add_argument(
        "--tracing",
        action="store_true",
        help="only the floors and redis-2 with tracing off, at 1%% and at 100%% (issue 27)",
    )
    parser.add_argument(
        "--store-timeout-ms",
        type=float,
        default=1000.0,
        help="ratelimit's Redis timeout in every case (default 1000: the service's 10 ms "
        "default times out on a loaded machine before anything is measured)",
    )
    args = parser.parse_args()
    with redis_server() as redis:
        return h2grpc.run_bench(
            args,
            lambda workers, workdir: bench_workers(workers, workdir, args, redis),
            "ratelimit-bench-",
        )


if __name__ == "__main__":
    sys.exit(main())
