"""Bench of the rate-limit service with h2load over h2c (gRPC without TLS).

    uv run python bench/ratelimit/run.py [--requests 20000] [--rps 500] [--seconds 10]

For each case it starts a fresh server process, checks one real gRPC answer,
then runs h2load twice with a fixed gRPC body (5-byte frame prefix +
serialized RateLimitRequest):

1. throughput: ``-n N -c C -m M`` as fast as it goes → rps;
2. latency at a fixed offered rate: ``-c 1 --rps R`` with ``--log-file`` →
   p50/p99 from the per-request times.

Cases: a no-op RLS on the same runtime (the baseline), the same no-op making
one bare Redis ``GET`` round trip per call (the floor of any decision that
consults Redis once on this runtime), ours on in-memory, ours on Redis with 1
and 3 descriptors, and over-limit traffic (a bucket already empty, so the
local cache answers). Ratios are given by req/s and by server CPU per request
(baseline CPU ÷ the case's), the steadier of the two on a shared machine.
Redis commands per decision come from ``INFO commandstats`` (reset before
each case; Lua's inner GET/INCRBY/PEXPIRE are counted there too) and round
trips per decision from the service's own
``meshplane_ratelimit_redis_round_trips_total``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.net import free_port, wait_for_port  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402

PATH = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
BIN = Path(sys.executable).parent
_HUGE = 4_000_000_000

CONFIG = f"""\
domain: bench
descriptors:
  - key: client
    rate_limit: {{unit: hour, requests_per_unit: {_HUGE}}}
  - key: route
    rate_limit: {{unit: hour, requests_per_unit: {_HUGE}}}
  - key: tenant
    rate_limit: {{unit: day, requests_per_unit: {_HUGE}}}
  - key: blocked
    rate_limit: {{unit: hour, requests_per_unit: 1}}
"""

_IGNORED_COMMANDS = {"info", "ping", "config", "command", "client", "hello", "select"}


def rls_request(*entries: tuple[str, str]) -> rls_pb2.RateLimitRequest:
    req = rls_pb2.RateLimitRequest(domain="bench")
    for key, value in entries:
        req.descriptors.add().entries.add(key=key, value=value)
    return req


def grpc_frame(message: rls_pb2.RateLimitRequest) -> bytes:
    body = message.SerializeToString()
    return struct.pack(">BI", 0, len(body)) + body


@dataclass
class Case:
    name: str
    server: str  # noop | noop-redis | memory | redis
    request: rls_pb2.RateLimitRequest
    expect_over: bool = False


CASES = [
    Case("no-op RLS (baseline)", "noop", rls_request(("client", "c1"))),
    Case("no-op RLS + 1 Redis GET (floor)", "noop-redis", rls_request(("client", "c1"))),
    Case("ours, in-memory, 1 descriptor", "memory", rls_request(("client", "c1"))),
    Case("ours, Redis, 1 descriptor", "redis", rls_request(("client", "c1"))),
    Case(
        "ours, Redis, 3 descriptors",
        "redis",
        rls_request(("client", "c1"), ("route", "r1"), ("tenant", "t1")),
    ),
    Case("ours, Redis, over-limit", "redis", rls_request(("blocked", "b")), expect_over=True),
]


_TICKS = os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its children (the spawned workers)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        this_pid, ppid = int(stat.parent.name), int(fields[1])
        if pid in (this_pid, ppid):
            total += (int(fields[11]) + int(fields[12])) / _TICKS
    return total


def redis_cpu_seconds(redis: RedisServer) -> float:
    info = redis.command("info", "cpu")
    user = re.search(r"used_cpu_user:([\d.]+)", info)
    system = re.search(r"used_cpu_sys:([\d.]+)", info)
    return float(user[1]) + float(system[1]) if user and system else 0.0


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def _start(
    kind: str, config: Path, redis: RedisServer
) -> tuple[subprocess.Popen[bytes], int, int | None]:
    port = free_port()
    metrics_port: int | None = None
    if kind in ("noop", "noop-redis"):
        cmd = [sys.executable, str(ROOT / "bench/ratelimit/noop_rls.py"), "--listen",
               f"127.0.0.1:{port}"]  # fmt: skip
        if kind == "noop-redis":
            cmd += ["--redis-port", str(redis.port)]
    else:
        metrics_port = free_port()
        while metrics_port == port:
            metrics_port = free_port()
        cmd = [str(BIN / "ratelimit"), "serve", "--config", str(config), "--listen",
               f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{metrics_port}"]  # fmt: skip
        if kind == "redis":
            cmd += ["--redis-url", redis.url]
        settings = config.parent / "settings.yaml"
        if settings.exists():
            cmd += ["--settings", str(settings)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, port, metrics_port


@contextlib.contextmanager
def server(kind: str, config: Path, redis: RedisServer) -> Iterator[tuple[int, int | None, int]]:
    # A free port can be taken by another process between our probe and the
    # server's bind (a busy shared machine): then start again on new ports.
    for attempt in range(3):
        proc, port, metrics_port = _start(kind, config, redis)
        try:
            wait_for_port(port, timeout=30)
            wait_serving(port)
            if proc.poll() is None:
                break
        except TimeoutError:
            pass
        _stop(proc)
        if attempt == 2:
            raise RuntimeError(f"could not start the {kind} server")
    try:
        yield port, metrics_port, proc.pid
    finally:
        _stop(proc)


def wait_serving(port: int) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise TimeoutError(f"server on {port} never became SERVING")


def check_answer(port: int, case: Case) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        for _ in range(2):  # the second call of the over-limit case is already denied
            resp = stub.ShouldRateLimit(case.request, timeout=5)
    want = (
        rls_pb2.RateLimitResponse.OVER_LIMIT if case.expect_over else rls_pb2.RateLimitResponse.OK
    )
    if resp.overall_code != want:
        raise RuntimeError(f"{case.name}: unexpected answer {resp}")


def h2load(port: int, body: Path, args: Sequence[str]) -> str:
    cmd = ["h2load", *args, "-d", str(body), "-H", "content-type: application/grpc",
           "-H", "te: trailers", f"http://127.0.0.1:{port}{PATH}"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600).stdout
    done = re.search(r"requests: (\d+) total, \d+ started, (\d+) done, (\d+) succeeded", out)
    if not done or done[1] != done[3]:
        raise RuntimeError(f"h2load saw failures:\n{out}")
    return out


def redis_commands(redis: RedisServer) -> dict[str, int]:
    stats = redis.command("info", "commandstats")
    return {
        m[1]: int(m[2])
        for m in re.finditer(r"cmdstat_([a-z|]+):calls=(\d+)", stats)
        if m[1] not in _IGNORED_COMMANDS
    }


def scrape(metrics_port: int | None, name: str) -> float:
    """One sample of the service's /metrics (``name`` may include its labels)."""
    if metrics_port is None:
        return 0.0
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    match = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.MULTILINE)
    return float(match[1]) if match else 0.0


_FAILED = 'meshplane_ratelimit_decisions_total{result="store_unavailable"}'


@dataclass
class Result:
    name: str
    rps: float
    p50_ms: float
    p99_ms: float
    commands_per_decision: float | None
    evalsha_per_decision: float | None
    round_trips_per_decision: float | None
    server_cpu_us: float = 0.0  # CPU of the server processes per request (throughput run)
    redis_cpu_us: float = 0.0  # CPU of redis-server per request (throughput run)
    failed_throughput: float = 0.0  # share of throughput-run answers that were UNAVAILABLE
    failed_latency: float = 0.0  # the same for the fixed-rate run


def run_case(case: Case, config: Path, redis: RedisServer, opts: argparse.Namespace) -> Result:
    tmp = Path(tempfile.mkdtemp(prefix="rl-bench-"))
    try:
        body = tmp / "body.bin"
        body.write_bytes(grpc_frame(case.request))
        with server(case.server, config, redis) as (port, metrics_port, pid):
            check_answer(port, case)
            cpu_before, redis_cpu_before = tree_cpu_seconds(pid), redis_cpu_seconds(redis)
            redis.command("config", "resetstat")
            rt_before = scrape(metrics_port, "meshplane_ratelimit_redis_round_trips_total")
            failed_before = scrape(metrics_port, _FAILED)
            out = h2load(port, body, ["-n", str(opts.requests), "-c", str(opts.clients),
                                      "-m", str(opts.streams)])  # fmt: skip
            rps = float(re.search(r"finished in [\d.]+m?s, ([\d.]+) req/s", out)[1])  # type: ignore[index]
            failed_mid = scrape(metrics_port, _FAILED)
            server_cpu = (tree_cpu_seconds(pid) - cpu_before) / opts.requests
            redis_cpu = (redis_cpu_seconds(redis) - redis_cpu_before) / opts.requests
            log = tmp / "latency.log"
            h2load(port, body, ["-n", str(opts.rps * opts.seconds), "-c", "1",
                                "--rps", str(opts.rps), "--log-file", str(log)])  # fmt: skip
            times = sorted(int(line.split("\t")[2]) / 1000 for line in log.read_text().splitlines())
            decisions = opts.requests + opts.rps * opts.seconds
            commands = redis_commands(redis)
            rt = scrape(metrics_port, "meshplane_ratelimit_redis_round_trips_total") - rt_before
            failed_end = scrape(metrics_port, _FAILED)
        uses_redis = case.server in ("redis", "noop-redis")
        evalsha = commands.get("evalsha", 0) + commands.get("eval", 0)
        return Result(
            case.name,
            rps,
            statistics.median(times),
            times[int(len(times) * 0.99) - 1],
            sum(commands.values()) / decisions if uses_redis else None,
            evalsha / decisions if uses_redis else None,
            rt / decisions if uses_redis else None,
            server_cpu * 1e6,
            redis_cpu * 1e6 if uses_redis else 0.0,
            (failed_mid - failed_before) / opts.requests,
            (failed_end - failed_mid) / (opts.rps * opts.seconds),
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def median_result(results: Sequence[Result]) -> Result:
    return Result(
        results[0].name,
        statistics.median(r.rps for r in results),
        statistics.median(r.p50_ms for r in results),
        statistics.median(r.p99_ms for r in results),
        _median([r.commands_per_decision for r in results]),
        _median([r.evalsha_per_decision for r in results]),
        _median([r.round_trips_per_decision for r in results]),
        statistics.median(r.server_cpu_us for r in results),
        statistics.median(r.redis_cpu_us for r in results),
        statistics.median(r.failed_throughput for r in results),
        statistics.median(r.failed_latency for r in results),
    )


def fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10000, help="throughput run size")
    parser.add_argument("--clients", type=int, default=4, help="h2load -c (throughput run)")
    parser.add_argument("--streams", type=int, default=16, help="h2load -m (throughput run)")
    parser.add_argument("--rps", type=int, default=500, help="offered rate of the latency run")
    parser.add_argument("--seconds", type=int, default=5, help="length of the latency run")
    parser.add_argument(
        "--repeat", type=int, default=3, help="rounds over all cases; medians are reported"
    )
    parser.add_argument(
        "--settings", type=Path, help="service settings YAML for our servers (default: none)"
    )
    parser.add_argument(
        "--cases", help="comma-separated case numbers to run (1-based; default: all)"
    )
    opts = parser.parse_args()
    if shutil.which("h2load") is None:
        print("h2load not found: apt-get install -y nghttp2-client", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="rl-bench-config-"))
    tmp = root / "config"
    tmp.mkdir()
    (tmp / "bench.yaml").write_text(CONFIG)
    if opts.settings:
        shutil.copy(opts.settings, root / "settings.yaml")
    cases = CASES
    if opts.cases:
        cases = [CASES[int(i) - 1] for i in opts.cases.split(",")]
    redis = RedisServer().start()
    rounds: list[list[Result]] = []
    try:
        # Cases are interleaved round by round, so load from other processes on
        # the machine affects every case alike; medians over the rounds are shown.
        for round_no in range(opts.repeat):
            rounds.append([])
            for case in cases:
                redis.command("flushall")
                rounds[-1].append(run_case(case, tmp, redis, opts))
                print(f"round {round_no + 1}: {case.name}: {rounds[-1][-1]}", file=sys.stderr)
    finally:
        redis.close()
        shutil.rmtree(root, ignore_errors=True)
    results = [median_result([r[i] for r in rounds]) for i in range(len(cases))]
    base, base_cpu = results[0].rps, results[0].server_cpu_us
    print(
        f"\nthroughput: h2load -n {opts.requests} -c {opts.clients} -m {opts.streams}; "
        f"latency: h2load -c 1 --rps {opts.rps} for {opts.seconds} s; 1 worker per server; "
        f"median of {opts.repeat} interleaved rounds\n"
    )
    print(
        "| case | rps | ratio to baseline | ratio CPU | p50 ms | p99 ms | Redis commands/decision "
        "| EVALSHA/decision | round trips/decision | server CPU µs/req | redis CPU µs/req "
        "| UNAVAILABLE (throughput / latency run) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r.name} | {r.rps:.0f} | {r.rps / base:.2f} | {base_cpu / r.server_cpu_us:.2f} "
            f"| {r.p50_ms:.2f} | {r.p99_ms:.2f} "
            f"| {fmt(r.commands_per_decision)} | {fmt(r.evalsha_per_decision)} "
            f"| {fmt(r.round_trips_per_decision, 3)} | {r.server_cpu_us:.0f} "
            f"| {r.redis_cpu_us:.0f} "
            f"| {r.failed_throughput:.1%} / {r.failed_latency:.1%} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
