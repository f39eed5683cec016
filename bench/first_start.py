"""How long ``scripts/run`` takes from cold to ready, and where the time goes.

    uv run python bench/first_start.py [--runs 1] [--keep-cache]

Each run is a first start: the real ``scripts/run`` (its setup, skipped when
done, then the orchestrator) on a fresh state directory and a free
``--port-base``, so mgmt-api migrates a new database, makes its keys and the
demo is seeded from nothing. Every line the orchestrator prints is stamped
as it arrives; the phases are the spans between its progress lines:

- setup: the spawn to ``starting mgmt-api`` (``scripts/setup``, ``uv run``,
  the orchestrator's imports);
- mgmt-api start: its start to ready (``/readyz``; the demo upstream and
  the workloads' apps start beside it), then seeding;
- services+agent: ratelimit, extauthz, the gateway and the agent started
  together, until the agent's tunnel is up;
- all ACK: the sidecars started, until both services serve the snapshot, the
  gateway and every sidecar ACKed and a request through the gateway answers;
- banner: the banner and ``ready:``.

CPU-seconds are the whole process tree's (user + system, of the live
processes and the ones already reaped) when ``ready:`` is printed: on a
loaded machine the wall time says more about the neighbours than about the
stack, the CPU time does not. Without ``--keep-cache`` the bytecode cache
(``.venv/pycache``, see ``demo/__main__.py``) is emptied first, so the run is
as cold as a first start after setup. Prints a table and the load average.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.h2grpc import load_note  # noqa: E402
from demo.stack import PORT_OFFSETS  # noqa: E402

TARGET_S = 40.0
#: (phase, the orchestrator line that ends it), in order.
PHASES = (
    ("setup", "starting mgmt-api"),
    ("mgmt-api start", "seeding organization"),
    ("seeding", "seeded:"),
    ("services+agent", "starting the mesh workloads"),
    ("all ACK", "meshplane is up:"),
    ("banner", "ready:"),
)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Run:
    stamps: dict[str, float] = field(default_factory=dict)
    cpu_s: float = 0.0
    ready_s: float = 0.0


def free_base() -> int:
    span = max(PORT_OFFSETS.values()) + 1
    for base in range(31000, 60000, 97):
        try:
            with contextlib.ExitStack() as held:
                for port in range(base, base + span):
                    held.enter_context(socket.socket()).bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise SystemExit("no free run of ports")


def tree_cpu_seconds(root: int) -> float:
    """User + system seconds of ``root`` and its descendants, reaped children included."""
    parents: dict[int, int] = {}
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        parents[pid], stats[pid] = int(fields[1]), fields
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            # utime, stime, cutime, cstime: fields 14-17 of stat, 12-15 after the name.
            total += sum(int(v) for v in stats[pid][11:15])
        todo += [child for child, parent in parents.items() if parent == pid]
    return total / CLOCK_TICKS


def one_run(state: Path, base: int) -> Run:
    run = Run()
    argv = [str(ROOT / "scripts" / "run"), "--state-dir", str(state), "--port-base", str(base)]
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            for _, marker in PHASES:
                if line.startswith(marker) and marker not in run.stamps:
                    run.stamps[marker] = time.monotonic() - started
            if line.startswith("ready:"):
                run.cpu_s = tree_cpu_seconds(proc.pid)
                run.ready_s = run.stamps["ready:"]
                break
            if line.startswith("stopping"):
                raise SystemExit(f"the stack stopped: {line.strip()}")
        else:
            raise SystemExit("scripts/run ended before ready")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return run


def report(runs: list[Run]) -> None:
    print(f"{'phase':<16}" + "".join(f"{f'run {i + 1}':>10}" for i in range(len(runs))))
    for phase, marker in PHASES:
        cells = []
        for run in runs:
            index = [m for _, m in PHASES].index(marker)
            before = run.stamps.get(PHASES[index - 1][1], 0.0) if index else 0.0
            cells.append(f"{run.stamps.get(marker, float('nan')) - before:>9.1f}s")
        print(f"{phase:<16}" + "".join(cells))
    print(f"{'ready (wall)':<16}" + "".join(f"{r.ready_s:>9.1f}s" for r in runs))
    print(f"{'CPU (tree)':<16}" + "".join(f"{r.cpu_s:>9.1f}s" for r in runs))
    print(f"target: ready under {TARGET_S:.0f} s on an idle two-core machine; {load_note()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument(
        "--keep-cache", action="store_true", help="keep .venv/pycache (a warm start)"
    )
    args = parser.parse_args()
    runs = []
    for _ in range(args.runs):
        if not args.keep_cache:
            shutil.rmtree(Path(sys.prefix) / "pycache", ignore_errors=True)
        with tempfile.TemporaryDirectory(prefix="meshplane-first-start-") as tmp:
            runs.append(one_run(Path(tmp) / ".run", free_base()))
    report(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
