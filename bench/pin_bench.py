"""Two workers, unpinned and pinned: where the CPU goes, per thread (issue 26, item 5).

    uv run python bench/pin_bench.py [--rounds 3] [--duration 4] [--rate 1000]
                                     [--cases floor check rls] [--workers 1 2]
                                     [--modes saturation gateway-like] [--no-pinned]

With two workers (SO_REUSEPORT processes, each an Envoy with pyvoy's Python
threads) our Check costs much more CPU a call than with one, while the
floor's two workers barely move. The hypothesis to test: with 2 processes x
3 busy threads (Envoy's worker, pyvoy's relay, the Python loop) plus h2load
on two cores, a loop thread is preempted while it holds the GIL, its relay
thread then blocks on the GIL (futex), and every such block is a wake-up
more. Pinning each worker's whole process to its own CPU keeps its threads
off the other worker's core; if the hypothesis holds, pinned runs should
show fewer context switches (involuntary ones first: preemptions) and less
CPU a call.

Each case is one server per ``--workers`` count (default 2; ``--workers 1 2``
compares one worker with two in the same rounds), all started at once:

- ``floor``: the raw ASGI no-op on pyvoy (``bench/asgi_noop.py``);
- ``check``: ``extauthz serve``, valid HS256 token (``bench/extauthz``'s config);
- ``rls``: ``ratelimit serve`` on a real redis-server, 2 descriptors
  (``bench/ratelimit/run.py``'s config and request).

Pinning is toggled on the *same* server between runs: every thread of worker
``i`` (the Envoy processes, in pid order) gets CPU ``i`` of this process's
allowed set (``os.sched_setaffinity`` per thread, as ``taskset -a -p``),
and unpinning gives every thread the whole set back. Each round measures,
per mode (saturation: 16 x 8; gateway-like: 4 x 1 at ``--rate`` req/s in
total) and case, unpinned then pinned (pinned first on odd rounds), so the
machine's drift falls on both alike. Per run: req/s, CPU per call (user +
system from ``/proc``, the server's whole tree), voluntary and involuntary
context switches per call, per thread label (summed over the two workers):

- ``wrk`` Envoy's worker thread, ``main`` Envoy's main thread,
- ``pyN`` the other threads named ``envoy`` (pyvoy's and Python's, in tid
  order inside each worker: the floor has two, pyvoy's loop and relay
  threads; our services start more, idle ones included),
- ``other`` everything else (Envoy's watchdogs and gRPC client threads, the
  supervisor).

Figures are medians of rounds, with the rounds' min-max for the totals.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import h2grpc  # noqa: E402
from bench.h2grpc import (  # noqa: E402
    Server,
    h2load_command,
    h2load_summary,
    load_note,
    load_shape,
    require_h2load,
)
from tests.support.redis_server import redis_server  # noqa: E402

_TICKS = os.sysconf("SC_CLK_TCK")

#: tid -> (process pid, label, CPU ticks, voluntary csw, involuntary csw)
Sample = dict[int, tuple[int, str, int, int, int]]


def workers_of(server: Server, count: int) -> list[int]:
    """The ``count`` Envoy processes of ``server`` (those with a ``wrk:`` thread), by pid."""
    found = []
    for pid in server.pids:
        names = [_comm(task) for task in Path(f"/proc/{pid}/task").glob("*")]
        if any(name.startswith("wrk:") for name in names):
            found.append(pid)
    if len(found) != count:
        raise SystemExit(f"{server.name}: found {len(found)} Envoy workers, wanted {count}")
    return sorted(found)


def _comm(task: Path) -> str:
    try:
        return (task / "comm").read_text().strip()
    except OSError:
        return ""


def pin(server: Server, count: int, pinned: bool) -> None:
    """Every thread of worker i on CPU i of the allowed set (or all back on the set)."""
    allowed = sorted(os.sched_getaffinity(0))
    for index, pid in enumerate(workers_of(server, count)):
        cpus = {allowed[index % len(allowed)]} if pinned else set(allowed)
        for task in Path(f"/proc/{pid}/task").glob("*"):
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(int(task.name), cpus)


def sample(server: Server, count: int) -> Sample:
    out: Sample = {}
    envoys = set(workers_of(server, count))
    for pid in server.pids:
        tasks = sorted(Path(f"/proc/{pid}/task").glob("*"), key=lambda t: int(t.name))
        pyvoy = 0
        for task in tasks:
            try:
                comm = (task / "comm").read_text().strip()
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                status = dict(
                    line.split(":", 1) for line in (task / "status").read_text().splitlines()
                )
            except OSError:
                continue
            tid = int(task.name)
            if pid not in envoys:
                label = "other"
            elif comm.startswith("wrk:"):
                label = "wrk"
            elif tid == pid:
                label = "main"
            elif comm == "envoy":
                pyvoy += 1
                label = f"py{pyvoy}"
            else:
                label = "other"
            out[tid] = (
                pid,
                label,
                int(fields[11]) + int(fields[12]),
                int(status["voluntary_ctxt_switches"]),
                int(status["nonvoluntary_ctxt_switches"]),
            )
    return out


@dataclass
class Result:
    rps: float
    calls: int
    #: label -> (CPU µs/call, voluntary csw/call, involuntary csw/call)
    threads: dict[str, tuple[float, float, float]]
    #: the busier worker's share of the two workers' CPU (0.5: even)
    busier: float

    @property
    def cpu(self) -> float:
        return sum(v[0] for v in self.threads.values())

    @property
    def voluntary(self) -> float:
        return sum(v[1] for v in self.threads.values())

    @property
    def involuntary(self) -> float:
        return sum(v[2] for v in self.threads.values())


def measure(case: Case, mode: str, duration: float, rate: int) -> Result:
    server, path, body = case.server, case.path, case.body
    gateway_rate = None if mode == "saturation" else rate
    cmd = h2load_command(server.port, path, body, duration, load_shape(mode), gateway_rate)
    before = sample(server, case.workers)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    after = sample(server, case.workers)
    summary = h2load_summary(out)
    if summary.failed or summary.ok < 0.99 * summary.done:
        raise SystemExit(f"{server.name} {mode}: {summary.failed} failed, {summary.ok} ok")
    calls = max(1, summary.ok)
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    per_worker: dict[int, int] = collections.Counter()
    for tid, (pid, label, ticks, vol, invol) in after.items():
        _, _, ticks0, vol0, invol0 = before.get(tid, (0, label, 0, 0, 0))
        if label != "other":
            per_worker[pid] += ticks - ticks0
        totals[label][0] += (ticks - ticks0) / _TICKS * 1e6 / calls
        totals[label][1] += (vol - vol0) / calls
        totals[label][2] += (invol - invol0) / calls
    busier = max(per_worker.values(), default=0) / max(1, sum(per_worker.values()))
    threads = {k: (v[0], v[1], v[2]) for k, v in totals.items()}
    return Result(summary.rps, calls, threads, busier)


@dataclass(frozen=True)
class Case:
    name: str
    server: Server
    path: str
    body: Path
    workers: int


@contextlib.contextmanager
def cases(names: list[str], counts: list[int], workdir: Path) -> Iterator[list[Case]]:
    """Every case at every worker count, named ``CASE/Nw``, all started at once."""
    from bench.extauthz import bench as extauthz  # noqa: PLC0415
    from bench.ratelimit import run as ratelimit  # noqa: PLC0415

    with contextlib.ExitStack() as stack:
        found = []
        config, tokens = extauthz.write_config(workdir, 10_000)
        body = workdir / "check.bin"
        request = extauthz.check_request(tokens["hs"], None).SerializeToString()
        body.write_bytes(extauthz.grpc_frame(request))
        redis = stack.enter_context(redis_server()) if "rls" in names else None
        rls_config, rls_body = workdir / "rls.yaml", workdir / "rls.bin"
        rls_config.write_text(ratelimit.CONFIG)
        rls_body.write_bytes(
            ratelimit.grpc_frame(ratelimit.REQUESTS["redis-2"].SerializeToString())
        )
        for n in counts:
            if "floor" in names:
                # The floor gets the Check request too, as bench/extauthz's floors do.
                server = stack.enter_context(
                    h2grpc.asgi_noop(n, extauthz.grpc_frame(extauthz.ALLOW))
                )
                found.append(Case(f"floor/{n}w", server, extauthz.METHOD, body, n))
            if "check" in names:
                server = stack.enter_context(extauthz.ours(config, n, "envoy"))
                extauthz.expect_status(server.port, body, 0)
                found.append(Case(f"check/{n}w", server, extauthz.METHOD, body, n))
            if redis is not None:
                server = stack.enter_context(
                    ratelimit.ours(rls_config, redis, n, "envoy", store_timeout_ms=1000.0)
                )
                ratelimit.check_answer(server.port, "redis-2")
                found.append(Case(f"rls/{n}w", server, ratelimit.PATH, rls_body, n))
        yield found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--rate", type=int, default=1000, help="gateway-like req/s in total")
    parser.add_argument(
        "--cases", nargs="+", default=["floor", "check", "rls"], choices=["floor", "check", "rls"]
    )
    parser.add_argument("--modes", nargs="+", default=["saturation", "gateway-like"])
    parser.add_argument("--workers", type=int, nargs="+", default=[2], help="worker counts")
    parser.add_argument(
        "--no-pinned", action="store_true", help="unpinned runs only (1 vs 2 workers, say)"
    )
    args = parser.parse_args()
    require_h2load()
    print(f"start: {load_note()}", flush=True)
    results: dict[tuple[str, str, bool], list[Result]] = collections.defaultdict(list)
    with (
        tempfile.TemporaryDirectory(prefix="pin-") as tmp,
        cases(args.cases, args.workers, Path(tmp)) as found,
    ):
        for case in found:
            measure(case, "saturation", 1, args.rate)  # warm-up
        pinnings = [(False,), (False,)] if args.no_pinned else [(False, True), (True, False)]
        for index in range(args.rounds):
            for mode in args.modes:
                for case in found:
                    for pinned in pinnings[index % 2]:
                        pin(case.server, case.workers, pinned)
                        result = measure(case, mode, args.duration, args.rate)
                        results[case.name, mode, pinned].append(result)
                        print(
                            f"  round {index + 1} {case.name:<6} {mode:<12} "
                            f"{'pinned' if pinned else 'unpinned':<8} {result.rps:8.0f} req/s "
                            f"{result.cpu:6.1f} µs/call csw {result.voluntary:5.2f}+"
                            f"{result.involuntary:5.2f}/call  busier worker "
                            f"{result.busier:.2f}  "
                            f"({os.getloadavg()[0]:.1f} load)",
                            flush=True,
                        )
                    pin(case.server, case.workers, False)
    report(results)
    print(f"\nend: {load_note()}")
    return 0


def report(results: dict[tuple[str, str, bool], list[Result]]) -> None:
    print("\n## Totals, medians of rounds (min-max)\n")
    print(
        "| case | mode | pinned | req/s | CPU µs/call | vol csw/call | invol csw/call "
        "| busier worker's CPU share |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for (name, mode, pinned), runs in results.items():
        rps = [r.rps for r in runs]
        cpu = [r.cpu for r in runs]
        print(
            f"| {name} | {mode} | {'yes' if pinned else 'no'} | {statistics.median(rps):.0f} "
            f"({min(rps):.0f}-{max(rps):.0f}) | {statistics.median(cpu):.1f} "
            f"({min(cpu):.1f}-{max(cpu):.1f}) | "
            f"{statistics.median(r.voluntary for r in runs):.2f} | "
            f"{statistics.median(r.involuntary for r in runs):.2f} | "
            f"{statistics.median(r.busier for r in runs):.2f} |"
        )
    print("\n## Per thread, medians of rounds (CPU µs/call, vol + invol csw/call)\n")
    print("(threads with at least 1 µs or 0.05 switches a call in some run)\n")
    found = {label for runs in results.values() for r in runs for label, v in r.threads.items()
             if v[0] >= 1.0 or v[1] + v[2] >= 0.05}  # fmt: skip
    labels = sorted(found, key=lambda x: (x != "wrk", x == "other", x))
    print("| case | mode | pinned | " + " | ".join(labels) + " |")
    print("|---|---|---|" + "---|" * len(labels))
    for (name, mode, pinned), runs in results.items():
        cells = []
        for label in labels:
            per = [r.threads.get(label, (0.0, 0.0, 0.0)) for r in runs]
            cells.append(
                f"{statistics.median(p[0] for p in per):.1f}, "
                f"{statistics.median(p[1] for p in per):.2f}+"
                f"{statistics.median(p[2] for p in per):.2f}"
            )
        print(f"| {name} | {mode} | {'yes' if pinned else 'no'} | " + " | ".join(cells) + " |")
    if any(pinned for _, _, pinned in results):
        print("\n## Pinned against unpinned, paired by round (median, min-max)\n")
        print("| case | mode | req/s pinned / unpinned | CPU µs/call pinned / unpinned |")
        print("|---|---|---|---|")
    for name, mode, pinned in results:
        off = results.get((name, mode, False))
        if not pinned or not off:
            continue
        on = results[name, mode, True]
        rps = [a.rps / b.rps for a, b in zip(on, off, strict=False)]
        cpu = [a.cpu / b.cpu for a, b in zip(on, off, strict=False) if b.cpu]
        print(
            f"| {name} | {mode} | {statistics.median(rps):.2f} ({min(rps):.2f}-{max(rps):.2f}) "
            f"| {statistics.median(cpu):.2f} ({min(cpu):.2f}-{max(cpu):.2f}) |"
        )
    print("\n## Against the floor (req/s ratio, same pinning; floor's CPU / ours)\n")
    for (name, mode, pinned), runs in results.items():
        kind, _, count = name.partition("/")
        floor = results.get((f"floor/{count}", mode, pinned))
        if kind == "floor" or not floor:
            continue
        rps_ratio = statistics.median(r.rps for r in runs) / statistics.median(r.rps for r in floor)
        cpu_ratio = statistics.median(r.cpu for r in floor) / statistics.median(r.cpu for r in runs)
        state = "pinned" if pinned else "unpinned"
        print(f"- {name} {mode} {state}: req/s {rps_ratio:.2f} of the floor's, CPU {cpu_ratio:.2f}")


if __name__ == "__main__":
    sys.exit(main())
