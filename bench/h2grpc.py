"""What the ext_authz and rate-limit benches share: servers, h2load, CPU, tables.

Each bench starts its servers (the floors and ours) once per worker count,
then interleaves the cases over several rounds, because on a shared machine
the neighbours' load drifts over minutes and a floor measured at one moment
compared with ours at another would mostly measure that drift. Every case is
measured twice:

- at saturation (``h2load -c 16 -m 8``): req/s, and server CPU per call from
  ``/proc`` (user + system of the server's whole process tree: supervisor,
  workers, Envoys), the steadier figure on a shared machine;
- at fixed offered rates (``h2load --rps``, one call in flight per
  connection, a connection per 250 calls a second): p50 and p99, since at
  saturation latency is only queueing.

With ``--gateway-like RPS`` each case is measured at saturation and as a
gateway's ext_authz or ratelimit filter calls it (issue 26, item 5): 4 connections, one
call in flight each, RPS calls a second in total. Calls then arrive one at a
time and each pays the server's wake-ups, which saturation shares between
calls; the run prints CPU and context switches per call, and the ratios to
the targets (a service at most 1.2x the floor's CPU per call, the floor at
most 2x native Envoy's).

The servers compared:

- ``envoy-direct``: Envoy answering every call itself with
  ``direct_response`` (no Python at all): the native limit;
- ``asgi-noop``: the raw ASGI no-op on pyvoy (Envoy + embedded Python, read
  the body, send a fixed answer and ``grpc-status: 0``): the floor of the
  server our services run on by default;
- ours, on the default server (and on ``--server h2`` where asked).

    uv run python bench/extauthz/bench.py        # or bench/ratelimit/run.py
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshplane.envoy_binary import ensure_envoy_api, envoy_path  # noqa: E402
from tests.support.net import free_port  # noqa: E402

BIN = Path(sys.executable).parent
_TICKS = os.sysconf("SC_CLK_TCK")
# As Envoy's ext_authz and ratelimit filters send them (grpc-timeout from the
# filter's timeout), so the servers take the path real traffic takes.
GRPC_HEADERS = ("content-type: application/grpc", "te: trailers", "grpc-timeout: 1S")


def process_tree(root: int) -> list[int]:
    """``root`` and all its descendants."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    tree = {root}
    grew = True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return sorted(tree)


def cpu_seconds(pids: Sequence[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / _TICKS


def context_switches(pids: Sequence[int]) -> int:
    """Voluntary + involuntary context switches of every thread of ``pids``.

    Per call, this counts the wake-ups a server pays (a thread blocking in
    ``epoll_wait``/``futex`` and being woken again): the cost that an isolated
    call pays and a saturated one shares, which CPU time alone does not say.
    """
    total = 0
    for pid in pids:
        for status in Path(f"/proc/{pid}/task").glob("*/status"):
            try:
                text = status.read_text()
            except OSError:
                continue
            for line in text.splitlines():
                if "ctxt_switches:" in line:
                    total += int(line.split(":")[1])
    return total


@dataclass
class Server:
    """A server process (tree) and where it answers gRPC."""

    name: str
    proc: subprocess.Popen[bytes]
    port: int
    pids: list[int] = field(default_factory=list)

    def refresh_pids(self) -> None:
        self.pids = process_tree(self.proc.pid)


def wait_serving(port: int, timeout: float = 60.0, *, health: bool = True) -> None:
    """Until the server answers health SERVING (or, without health, any gRPC status)."""
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
                if not health or reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError as exc:
                if not health and exc.code() != grpc.StatusCode.UNAVAILABLE:
                    return  # answers gRPC (no health service): up
            if time.monotonic() > deadline:
                raise TimeoutError(f"server on {port} never became ready")
            time.sleep(0.2)


@contextlib.contextmanager
def started(
    name: str, cmd: list[str], port: int, *, health: bool = True, env: dict[str, str] | None = None
) -> Iterator[Server]:
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    server = Server(name, proc, port)
    try:
        wait_serving(port, health=health)
        time.sleep(1.0)  # every worker up
        server.refresh_pids()
        yield server
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def listening(name: str, cmd: list[str]) -> contextlib.AbstractContextManager[Server]:
    """``cmd --listen 127.0.0.1:PORT`` on a free port, until it is SERVING."""
    port = free_port()
    return started(name, [*cmd, "--listen", f"127.0.0.1:{port}"], port)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags both benches take."""
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (medians)")
    parser.add_argument(
        "--rates", type=int, nargs="*", default=[1000, 5000], help="offered req/s for latency"
    )
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument(
        "--gateway-like",
        type=int,
        metavar="RPS",
        help="saturation and the gateway-like mode: 4 connections x 1 stream at RPS req/s in "
        "total (what a gateway's filters send), CPU and context switches per call; no --rates",
    )


def run_bench(
    args: argparse.Namespace, bench_workers: Callable[[int, Path], list[Run]], prefix: str
) -> int:
    """Every worker count in turn, then the table of medians and ratios."""
    require_h2load()
    results: list[Run] = []
    started_at = time.strftime("%Y-%m-%d %H:%M")
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        for workers in args.workers:
            results += bench_workers(workers, Path(tmp))
    print()
    print(report(results, [FLOOR, H2_FLOOR, NATIVE]))
    if args.gateway_like is not None:
        print()
        print(gateway_targets(results, gateway_mode(args.gateway_like)))
    print(f"\nstarted {started_at}; {load_note()}")
    write_json(args.json, results)
    return 0


def asgi_noop(workers: int, response: bytes) -> contextlib.AbstractContextManager[Server]:
    """The raw ASGI no-op on pyvoy (``bench/asgi_noop.py``), ``workers`` Envoys on one port."""
    port = free_port()
    cmd = [sys.executable, str(ROOT / "bench/asgi_noop.py"), "--port", str(port),
           "--workers", str(workers), "--response-hex", response.hex()]  # fmt: skip
    return started("asgi-noop", cmd, port, health=False)


def h2_noop(workers: int, response: bytes) -> contextlib.AbstractContextManager[Server]:
    """The same raw ASGI no-op on the h2 backend's server (``bench/h2_noop.py``): its floor."""
    port = free_port()
    cmd = [sys.executable, str(ROOT / "bench/h2_noop.py"), "--port", str(port),
           "--workers", str(workers), "--response-hex", response.hex()]  # fmt: skip
    return started("h2-noop", cmd, port, health=False)


def envoy_direct(
    workers: int, response: bytes, workdir: Path
) -> contextlib.AbstractContextManager[Server]:
    """Envoy's ``direct_response`` with the framed answer: no Python anywhere."""
    port = free_port()
    config = {
        "static_resources": {
            "listeners": [
                {
                    "name": "direct",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": {
                                        "@type": "type.googleapis.com/envoy.extensions.filters."
                                        "network.http_connection_manager.v3.HttpConnectionManager",
                                        "stat_prefix": "direct",
                                        "codec_type": "AUTO",
                                        "route_config": {
                                            "virtual_hosts": [
                                                {
                                                    "name": "all",
                                                    "domains": ["*"],
                                                    "routes": [
                                                        {
                                                            "match": {"prefix": "/"},
                                                            "direct_response": {
                                                                "status": 200,
                                                                "body": {
                                                                    "inline_bytes": _b64(response)
                                                                },
                                                            },
                                                            "response_headers_to_add": [
                                                                {
                                                                    "header": {
                                                                        "key": "grpc-status",
                                                                        "value": "0",
                                                                    }
                                                                }
                                                            ],
                                                        }
                                                    ],
                                                }
                                            ]
                                        },
                                        "http_filters": [
                                            {
                                                "name": "envoy.filters.http.router",
                                                "typed_config": {
                                                    "@type": "type.googleapis.com/envoy.extensions."
                                                    "filters.http.router.v3.Router"
                                                },
                                            }
                                        ],
                                    },
                                }
                            ]
                        }
                    ],
                }
            ]
        }
    }
    path = workdir / f"direct-{port}.json"
    path.write_text(json.dumps(config))
    ensure_envoy_api()
    cmd = [str(envoy_path()), "-c", str(path), "--concurrency", str(workers),
           "--use-dynamic-base-id", "--log-level", "error"]  # fmt: skip
    return started("envoy-direct", cmd, port, health=False)


def _b64(data: bytes) -> str:
    import base64  # noqa: PLC0415

    return base64.b64encode(data).decode()


@dataclass
class Run:
    case: str
    workers: int
    mode: str  # "saturation" or "rate:<offered>"
    rps: float
    p50_ms: float
    p99_ms: float
    cpu_us: float
    done: int
    failed: int
    switches: float = 0.0  # context switches of the server's threads per call


@dataclass(frozen=True)
class H2loadSummary:
    """What h2load's report says: req/s, and requests done, failed (failed +
    errored) and answered 2xx."""

    rps: float
    done: int
    failed: int
    ok: int


def h2load_summary(out: str) -> H2loadSummary:
    """Parse h2load's stdout report (the one reader of its format)."""
    lines = out.splitlines()

    def line(prefix: str) -> str:
        return next(x for x in lines if x.startswith(prefix)).split(":", 1)[1]

    finished = next(x for x in lines if x.startswith("finished in"))
    numbers = [int(part.split()[0]) for part in line("requests:").split(",")]
    ok = int(line("status codes:").split(",")[0].split()[0])
    return H2loadSummary(
        float(finished.split(",")[1].split()[0]), numbers[2], numbers[4] + numbers[5], ok
    )


#: h2load's (connections, streams each) at saturation, and the gateway-like mode's
#: connections of one stream each (issue 26, item 5: what a gateway's filters send).
SATURATION = (16, 8)
GATEWAY_CLIENTS = 4


def load_shape(mode: str) -> tuple[int, int]:
    """(connections, streams each) of a mode: "saturation", or else gateway-like."""
    return SATURATION if mode == "saturation" else (GATEWAY_CLIENTS, 1)


def h2load_command(
    port: int,
    path: str,
    body: Path,
    duration: float,
    shape: tuple[int, int],
    rate: int | None = None,
    *,
    log: Path | None = None,
) -> list[str]:
    """One h2load run of unary gRPC calls as Envoy's filters send them (one owner
    of the flags every bench passes): ``shape`` is (connections, streams each),
    ``rate`` the total req/s (None: as fast as answered), ``log`` a per-request log."""
    clients, streams = shape
    cmd = ["h2load", "-D", str(max(1, round(duration))), "-c", str(clients), "-m", str(streams),
           "-t", "1", "-d", str(body)]  # fmt: skip
    if log is not None:
        cmd += ["--log-file", str(log)]
    for header in GRPC_HEADERS:
        cmd += ["-H", header]
    if rate is not None:
        cmd += ["--rps", str(max(1, rate // clients))]
    return [*cmd, f"http://127.0.0.1:{port}{path}"]


def h2load(
    server: Server,
    path: str,
    body: Path,
    *,
    duration: float,
    clients: int = 16,
    streams: int = 8,
    rate: int | None = None,
    workdir: Path,
) -> tuple[float, float, float, float, int, int, float]:
    """(req/s, p50 ms, p99 ms, server CPU µs per call, done, failed, switches per call)."""
    log = workdir / "h2load.log"
    log.unlink(missing_ok=True)
    cmd = h2load_command(server.port, path, body, duration, (clients, streams), rate, log=log)
    before, switches = cpu_seconds(server.pids), context_switches(server.pids)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    after, switches = cpu_seconds(server.pids), context_switches(server.pids) - switches
    summary = h2load_summary(out)
    req_s, done, failed = summary.rps, summary.done, summary.failed
    times = sorted(int(line.split("\t")[2]) for line in log.read_text().splitlines() if line)
    p50 = statistics.median(times) / 1000 if times else 0.0
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))] / 1000 if times else 0.0
    cpu = (after - before) * 1e6 / max(done, 1)
    return req_s, p50, p99, cpu, done, failed, switches / max(done, 1)


@dataclass(frozen=True)
class Target:
    case: str
    server: Server
    path: str
    body: Path
    latency: bool = True


def gateway_mode(rate: int) -> str:
    return f"gateway-like {rate}/s"


def measure(
    target: Target,
    workers: int,
    *,
    duration: float,
    rates: Sequence[int],
    workdir: Path,
    gateway_like: int | None = None,
) -> list[Run]:
    """A 1 s warm-up, one saturation run, and one run per offered rate.

    With ``gateway_like``, saturation and then 4 connections with one call in flight
    each at a fixed total rate, as a gateway's ext_authz and ratelimit
    filters call a service (issue 26, item 5): each call then arrives alone
    and pays the server's wake-ups, which saturation shares between calls.
    """
    h2load(target.server, target.path, target.body, duration=1, workdir=workdir)
    runs = []
    if gateway_like is not None:
        # Saturation beside it, as issue 26's table has them: the gap between
        # the two is the wake-up cost that saturation hides.
        result = h2load(target.server, target.path, target.body, duration=duration, workdir=workdir)
        runs.append(Run(target.case, workers, "saturation", *result))
        result = h2load(
            target.server, target.path, target.body, duration=duration,
            clients=GATEWAY_CLIENTS, streams=1, rate=gateway_like, workdir=workdir,
        )  # fmt: skip
        runs.append(Run(target.case, workers, gateway_mode(gateway_like), *result))
        _print_runs(runs)
        return runs
    result = h2load(target.server, target.path, target.body, duration=duration, workdir=workdir)
    runs.append(Run(target.case, workers, "saturation", *result))
    if target.latency:
        for rate in rates:
            # One call in flight per connection, at most 250 calls a second
            # each, so that the offered rate is reached whatever the latency.
            result = h2load(
                target.server, target.path, target.body, duration=duration,
                clients=max(4, rate // 250), streams=1, rate=rate, workdir=workdir,
            )  # fmt: skip
            runs.append(Run(target.case, workers, f"rate {rate}/s", *result))
    _print_runs(runs)
    return runs


def _print_runs(runs: Sequence[Run]) -> None:
    for run in runs:
        print(
            f"  {run.case:<22} {run.mode:<12} {run.rps:8.0f} req/s  p50 {run.p50_ms:6.2f} ms  "
            f"p99 {run.p99_ms:6.2f} ms  cpu {run.cpu_us:6.1f} µs/call  "
            f"csw {run.switches:5.2f}/call  failed {run.failed}",
            flush=True,
        )


def floors(direct: Server, noop: Server, path: str, body: Path) -> list[Target]:
    """The floors, measured with the same request as ours."""
    return [
        Target("envoy-direct", direct, path, body),
        Target("asgi-noop", noop, path, body),
    ]


def rounds(
    targets: Sequence[Target], workers: int, args: argparse.Namespace, workdir: Path
) -> list[Run]:
    """Every target once per round, ``args.rounds`` times (interleaved)."""
    results: list[Run] = []
    for index in range(args.rounds):
        print(f" round {index + 1}/{args.rounds}", flush=True)
        for target in targets:
            results += measure(
                target,
                workers,
                duration=args.duration,
                rates=args.rates,
                workdir=workdir,
                gateway_like=args.gateway_like,
            )
    return results


def report(results: list[Run], baselines: Sequence[str]) -> str:
    """Medians over rounds; saturation ratios to each baseline at the same worker count.

    ``x req/s`` is ours over the baseline's throughput; ``x CPU`` is the
    baseline's CPU per call over ours (both read "fraction of the floor":
    1.0 means as cheap as the baseline).
    """
    head = "| workers | case | mode | req/s | CPU µs/call | csw/call | p50 ms | p99 ms | failed |"
    rule = "|---|---|---|---|---|---|---|---|---|"
    for base in baselines:
        head += f" vs {base} (req/s, CPU) |"
        rule += "---|"
    lines = [head, rule]
    keys: list[tuple[int, str, str]] = []
    for run in results:
        if (key := (run.workers, run.case, run.mode)) not in keys:
            keys.append(key)
    for workers, case, mode in keys:
        runs = [r for r in results if (r.workers, r.case, r.mode) == (workers, case, mode)]
        rps = statistics.median(r.rps for r in runs)
        cpu = statistics.median(r.cpu_us for r in runs)
        line = (
            f"| {workers} | {case} | {mode} | {rps:.0f} | {cpu:.1f} | "
            f"{statistics.median(r.switches for r in runs):.2f} | "
            f"{statistics.median(r.p50_ms for r in runs):.2f} | "
            f"{statistics.median(r.p99_ms for r in runs):.2f} | {sum(r.failed for r in runs)} |"
        )
        for base in baselines:
            ref = [r for r in results if (r.workers, r.case, r.mode) == (workers, base, mode)]
            compared = mode == "saturation" or mode.startswith("gateway-like")
            if not compared or not ref or case == base:
                line += " - |"
                continue
            base_rps = statistics.median(r.rps for r in ref)
            base_cpu = statistics.median(r.cpu_us for r in ref)
            line += f" {rps / base_rps:.2f}, {base_cpu / cpu if cpu else 0:.2f} |"
        lines.append(line)
    return "\n".join(lines)


FLOOR, NATIVE = "asgi-noop", "envoy-direct"
#: The same no-op on the h2 backend's own server (``bench/h2_noop.py``).
H2_FLOOR = "h2-noop"
#: Issue 26, item 5, at gateway-like load: a service's CPU per call at most
#: this many times the floor's; the floor's at most this many times native Envoy's.
SERVICE_TARGET, FLOOR_TARGET = 1.2, 2.0


def gateway_targets(results: Sequence[Run], mode: str) -> str:
    """The two gateway-like ratios of CPU per call (medians of rounds) against the targets."""
    lines = []
    for workers in sorted({r.workers for r in results}):
        cpu = {
            case: statistics.median(
                r.cpu_us for r in results if (r.workers, r.case, r.mode) == (workers, case, mode)
            )
            for case in {r.case for r in results if (r.workers, r.mode) == (workers, mode)}
        }
        if FLOOR not in cpu or NATIVE not in cpu:
            continue
        for floor in (FLOOR, H2_FLOOR) if H2_FLOOR in cpu else (FLOOR,):
            ratio = cpu[floor] / cpu[NATIVE]
            lines.append(
                f"{workers} worker(s), {mode}: {floor} ÷ native {ratio:.2f}x "
                f"(target <= {FLOOR_TARGET}x: {'met' if ratio <= FLOOR_TARGET else 'NOT met'})"
            )
        for case in sorted(set(cpu) - {FLOOR, H2_FLOOR, NATIVE}):
            # A service against the pyvoy floor (the issue's) and, on h2, its own server's.
            floors = (FLOOR, H2_FLOOR) if case.endswith("-h2") and H2_FLOOR in cpu else (FLOOR,)
            for floor in floors:
                ratio = cpu[case] / cpu[floor]
                met = "met" if ratio <= SERVICE_TARGET else "NOT met"
                lines.append(
                    f"{workers} worker(s), {mode}: {case} ÷ {floor} {ratio:.2f}x "
                    f"(target <= {SERVICE_TARGET}x: {met})"
                )
    return "\n".join(lines)


def write_json(path: Path | None, results: list[Run]) -> None:
    if path is not None:
        path.write_text(json.dumps([asdict(r) for r in results], indent=2))


def require_h2load() -> None:
    if shutil.which("h2load") is None:
        raise SystemExit("h2load not found: apt-get install -y nghttp2-client")


def load_note() -> str:
    """The machine's load average when the bench ends (for the doc's noise note)."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"
