"""Where an isolated call's time goes on the Envoy-based server: per thread, per system call.

    uv run python bench/server_anatomy.py [--rate 1000] [--duration 4] [--rounds 2] [--strace]
                                          [--loop uvloop asyncio]

Issue 26, item 5: at a gateway-like load (4 connections x 1 stream, a fixed
rate) the raw ASGI no-op on pyvoy costs far more CPU per call than at
saturation, and about 2.5x Envoy's own ``direct_response``. This bench
starts, with one Envoy worker thread each:

- ``envoy-direct``: Envoy answering with ``direct_response`` (native);
- ``asgi-noop`` on each ``--loop`` (pyvoy's ``loop`` setting: uvloop is its
  default, asyncio the standard library's);

(with ``--pinned``, the first loop's no-op again with every thread on one
CPU), and, alternated over ``--rounds``, drives each with h2load at the
gateway-like rate and at saturation (16 x 8). For each run it prints, per
thread *name* (``/proc/PID/task/TID/comm``; Envoy's worker is ``wrk:worker_0``,
the Python loop thread is pyvoy's), CPU µs per call and context switches per
call, read from ``/proc`` before and after. With ``--strace``, one more run
per server and mode under ``strace -c -f`` gives system calls per call
(strace slows the server, so its timings are not used, only its counts).

CPU from /proc is what a shared machine disturbs least; context switches
and system calls per call do not depend on the load at all, so they are
what to read first.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import h2grpc  # noqa: E402
from bench.h2grpc import (  # noqa: E402
    Server,
    envoy_direct,
    h2load_command,
    h2load_summary,
    load_note,
    load_shape,
    require_h2load,
)
from tests.support.net import free_port  # noqa: E402

ANSWER = b"\x00\x00\x00\x00\x00"  # an empty framed message
PATH = "/bench.Noop/Call"
CHECK_PATH = "/envoy.service.auth.v3.Authorization/Check"
_TICKS = os.sysconf("SC_CLK_TCK")


def threads(pids: list[int]) -> dict[int, tuple[str, int, int]]:
    """tid -> (thread name, CPU ticks, context switches), for every thread of ``pids``."""
    out = {}
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                comm = (task / "comm").read_text().strip()
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                status = (task / "status").read_text()
            except OSError:
                continue
            switches = sum(
                int(line.split(":")[1]) for line in status.splitlines() if "ctxt_switches:" in line
            )
            out[int(task.name)] = (comm, int(fields[11]) + int(fields[12]), switches)
    return out


def by_name(
    before: dict[int, tuple[str, int, int]], after: dict[int, tuple[str, int, int]], calls: int
) -> dict[str, tuple[float, float]]:
    """Thread name -> (CPU µs per call, context switches per call), threads of a name summed."""
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for tid, (comm, ticks, switches) in after.items():
        _, ticks0, switches0 = before.get(tid, (comm, 0, 0))
        # Envoy names its worker threads wrk:worker_N; pyvoy's and Python's keep "envoy".
        name = re.sub(r"\d+$", "N", comm)
        totals[name][0] += (ticks - ticks0) / _TICKS * 1e6 / calls
        totals[name][1] += (switches - switches0) / calls
    return {k: (v[0], v[1]) for k, v in totals.items() if v[0] or v[1]}


def h2load_cmd(server: Server, body: Path, duration: float, mode: str, rate: int) -> list[str]:
    """h2load against ``server``: our Check gets its Check request, the others a no-op call."""
    if server.name == "check":
        body, path = body.with_name("check.bin"), CHECK_PATH
    else:
        path = PATH
    gateway_rate = None if mode == "saturation" else rate
    return h2load_command(server.port, path, body, duration, load_shape(mode), gateway_rate)


def run(cmd: list[str]) -> int:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return max(1, h2load_summary(out).ok)


def measure(server: Server, cmd: list[str]) -> tuple[int, dict[str, tuple[float, float]]]:
    before = threads(server.pids)
    calls = run(cmd)
    return calls, by_name(before, threads(server.pids), calls)


def syscalls(server: Server, cmd: list[str], workdir: Path) -> dict[str, float]:
    """System calls per call of the server's main Envoy process (all its threads)."""
    out = workdir / "strace.txt"
    envoy = max(server.pids)  # the Envoy process (the launcher, if any, is its parent)
    tracer = subprocess.Popen(
        ["strace", "-c", "-f", "-p", str(envoy), "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(1.0)  # attached to every thread
        calls = run(cmd)
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(30)
    counts: dict[str, float] = {}
    for line in out.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
            counts[parts[-1]] = int(parts[3]) / calls
    return counts


@contextlib.contextmanager
def noop(loop: str, cpu: int | None = None, threads: int | None = None) -> Iterator[Server]:
    """The raw ASGI no-op on ``loop``; with ``cpu``, every thread pinned to that CPU;
    with ``threads``, pyvoy's ``worker_threads`` setting."""
    port = free_port()
    cmd = [sys.executable, str(ROOT / "bench/asgi_noop.py"), "--port", str(port),
           "--response-hex", ANSWER.hex(), "--loop", loop]  # fmt: skip
    name = f"asgi-noop/{loop}"
    if threads is not None:
        cmd, name = [*cmd, "--worker-threads", str(threads)], f"{name}/wt{threads}"
    if cpu is not None:
        cmd, name = ["taskset", "-c", str(cpu), *cmd], f"{name}/cpu{cpu}"
    with h2grpc.started(name, cmd, port, health=False) as server:
        yield server


@contextlib.contextmanager
def check_server(workdir: Path) -> Iterator[Server]:
    """``extauthz serve``, one worker, with bench/extauthz's policies; its Check body written."""
    from bench.extauthz import bench as extauthz_bench  # noqa: PLC0415

    config, tokens = extauthz_bench.write_config(workdir, 10_000)
    request = extauthz_bench.check_request(tokens["hs"], None).SerializeToString()
    (workdir / "check.bin").write_bytes(extauthz_bench.grpc_frame(request))
    with extauthz_bench.ours(config, 1, "envoy") as server:
        server.name = "check"
        yield server


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=int, default=1000, help="gateway-like req/s in total")
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--loop", nargs="+", default=["uvloop"], choices=["uvloop", "asyncio"])
    parser.add_argument("--strace", action="store_true", help="also count system calls per call")
    parser.add_argument(
        "--worker-threads",
        type=int,
        help="also the no-op (first --loop) with pyvoy's worker_threads set to this",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="also our ext_authz Check (1 worker, valid HS256 token), as bench/extauthz does",
    )
    parser.add_argument(
        "--pinned",
        action="store_true",
        help="also the no-op (first --loop) with all its threads on one CPU (taskset -c 1): "
        "do the hand-offs cost less when both threads share a core?",
    )
    args = parser.parse_args()
    require_h2load()
    modes = (f"gateway-like {args.rate}/s", "saturation")
    samples: dict[tuple[str, str], list[tuple[int, dict[str, tuple[float, float]]]]] = {}
    counted: dict[tuple[str, str], dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="anatomy-") as tmp, contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        body = workdir / "body.bin"
        body.write_bytes(ANSWER)
        servers = [stack.enter_context(envoy_direct(1, ANSWER, workdir))]
        servers += [stack.enter_context(noop(loop)) for loop in args.loop]
        if args.pinned:
            servers.append(stack.enter_context(noop(args.loop[0], cpu=1)))
        if args.worker_threads:
            servers.append(stack.enter_context(noop(args.loop[0], threads=args.worker_threads)))
        if args.check:
            servers.append(stack.enter_context(check_server(workdir)))
        for server in servers:
            run(h2load_cmd(server, body, 1, "saturation", args.rate))  # warm-up
        for index in range(args.rounds):
            for mode in modes:
                for server in servers:
                    cmd = h2load_cmd(server, body, args.duration, mode, args.rate)
                    result = measure(server, cmd)
                    samples.setdefault((server.name, mode), []).append(result)
                    cpu = sum(c for c, _ in result[1].values())
                    print(f"  round {index + 1} {server.name:<18} {mode:<20} {cpu:6.1f} µs/call")
        if args.strace:
            for mode in modes:
                for server in servers:
                    cmd = h2load_cmd(server, body, args.duration, mode, args.rate)
                    counted[server.name, mode] = syscalls(server, cmd, workdir)
    report(samples, counted)
    print(f"\n{load_note()}")
    return 0


def report(
    samples: dict[tuple[str, str], list[tuple[int, dict[str, tuple[float, float]]]]],
    counted: dict[tuple[str, str], dict[str, float]],
) -> None:
    print("\n## Per thread, medians of rounds (CPU µs per call / context switches per call)\n")
    print("| server | mode | thread | CPU µs/call | csw/call |\n|---|---|---|---|---|")
    for (name, mode), runs in samples.items():
        names = sorted({t for _, per in runs for t in per})
        for thread in [*names, "(all)"]:
            if thread == "(all)":
                cpu = statistics.median(sum(c for c, _ in per.values()) for _, per in runs)
                csw = statistics.median(sum(s for _, s in per.values()) for _, per in runs)
            else:
                cpu = statistics.median(per.get(thread, (0.0, 0.0))[0] for _, per in runs)
                csw = statistics.median(per.get(thread, (0.0, 0.0))[1] for _, per in runs)
            print(f"| {name} | {mode} | {thread} | {cpu:.1f} | {csw:.2f} |")
    if not counted:
        return
    print("\n## System calls per call (strace -c -f on the Envoy process, one run each)\n")
    calls = sorted({c for per in counted.values() for c, n in per.items() if n >= 0.05})
    keys = list(counted)
    print("| syscall | " + " | ".join(f"{n} {m}" for n, m in keys) + " |")
    print("|---|" + "---|" * len(keys))
    for call in calls:
        print(f"| {call} | " + " | ".join(f"{counted[k].get(call, 0.0):.2f}" for k in keys) + " |")
    totals = " | ".join(f"{sum(counted[k].values()):.2f}" for k in keys)
    print(f"| **all** | {totals} |")


if __name__ == "__main__":
    sys.exit(main())
