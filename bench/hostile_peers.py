"""The hostile-peer figures of docs/runtime.md, rerun: worker memory and victim p99 per attack.

One echo supervisor (one worker) per backend; for each attack, a grpcio victim
calls Health/Check on its own connection while the attacker works, and the
worker's resident memory (/proc/PID/status VmRSS) is sampled every 20 ms:

- ``reflection``: one ServerReflectionInfo stream whose window is zero,
  sending small requests as fast as the worker takes them (each asks for a
  1.5 KB or a 14 KB answer) for ``--seconds``;
- ``held``: ``--connections`` connections x 4 streams, each sending 3.9 MiB of
  a 4 MiB message and never ending it, held ``--seconds``.

Printed per backend and attack: the worker's idle RSS, its peak above idle,
what stayed above idle 10 s after the peers left, the victim's p99 and
failures, and how long the worker kept a CPU busy after the peers left.

    uv run --frozen python bench/hostile_peers.py --servers h2,envoy
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.runtime.hostile_peers import (
    MIB,
    Meter,
    Victim,
    held_bodies,
    quiet,
    reflection_flood,
    settle,
    worker_pid,
)
from tests.runtime.supervisors import Supervisor


def _attack(name: str, port: int, args: argparse.Namespace) -> str:
    if name == "reflection":
        flood = asyncio.run(reflection_flood(port, args.seconds, 64 * MIB))
        return f"sent {flood.sent / MIB:.1f} MiB of requests"
    held = asyncio.run(
        held_bodies(port, args.connections, 4, int(3.9 * MIB), lambda _: False, args.seconds)
    )
    return f"{held.holding} streams held, {held.cut_off} connections cut off"


def run(kind: str, attacks: list[str], args: argparse.Namespace) -> None:
    sup = Supervisor(kind, workers=1)
    try:
        sup.wait_serving()
        pid = worker_pid(sup.proc.pid)
        for name in attacks:
            idle = settle(pid, lambda _: True)
            with Victim(sup.port) as victim, Meter(pid) as meter:
                note = _attack(name, sup.port, args)
            busy = quiet(pid, timeout=120)
            time.sleep(10)  # what stays resident once the worker is idle again
            after = settle(pid, lambda _: True)
            peak = (meter.peak - idle) / MIB
            print(
                f"{kind:7} {name:10} idle {idle / MIB:6.0f} MiB  peak +{peak:6.0f}"
                f" MiB  after +{(after - idle) / MIB:5.0f} MiB  victim p99"
                f" {victim.p99() * 1000:7.1f} ms ({len(victim.latencies)} calls,"
                f" failed: {dict(victim.failures)})  busy after {busy:5.1f} s  [{note}]",
                flush=True,
            )
    finally:
        sup.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", default="h2,envoy")
    parser.add_argument("--attacks", default="reflection,held")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--connections", type=int, default=120)
    args = parser.parse_args()
    for kind in args.servers.split(","):
        run(kind, args.attacks.split(","), args)


if __name__ == "__main__":
    main()
