"""A worker's memory stays bounded whatever its peers do, on every backend.

The two attacks of tests/runtime/hostile_peers.py against one echo worker per
backend, over real sockets, while a well-behaved client calls Health/Check on
its own connection:

- one ServerReflectionInfo stream whose window is zero, pipelining small
  requests that each ask for an answer tens of times bigger (before the
  bound: +700 MiB on the h2 backend, the victim's calls took 15 s, and the
  worker kept a CPU busy for a minute after the attacker left);
- 120 connections x 4 streams, each holding an unfinished 3.9 MiB body
  (before: +2.4 GiB on h2, +3.4 GiB on Envoy, most of it kept after the
  peers left).

The bound: at most :data:`PEAK_BOUND` above the worker's idle resident memory
(/proc/PID/status VmRSS) at any time, and back within :data:`AFTER_BOUND` of it
once the peers are gone; the victim's p99 under :data:`P99_BOUND`. Generous, so
that they hold on a loaded 2-core machine; the figures a quiet machine gives are
in docs/runtime.md (bench/hostile_peers.py reruns them).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from tests.runtime.hostile_peers import (
    MIB,
    HoldResult,
    Meter,
    Victim,
    held_bodies,
    quiet,
    reflection_flood,
    rss,
    settle,
    worker_pid,
)
from tests.runtime.supervisors import Supervisor
from tests.support.backends import BACKENDS

PEAK_BOUND = 256 * MIB
AFTER_BOUND = 128 * MIB
#: Before the bounds the victim's calls took 15 s. A quiet machine gives 25 ms
#: (docs/runtime.md, from bench/hostile_peers.py); six busy loops on the two
#: cores gave 0.6 s, over half of an earlier 1 s bound. 5 s still catches the
#: regression without timing the machine's load.
P99_BOUND = 5.0
CONNECTIONS, STREAMS = 120, 4


@pytest.fixture(scope="module", params=BACKENDS)
def worker(request: pytest.FixtureRequest) -> Iterator[tuple[Supervisor, int]]:
    """One echo supervisor with one worker per backend, shared by the file's tests."""
    sup = Supervisor(request.param, workers=1)
    try:
        sup.wait_serving()
        yield sup, worker_pid(sup.proc.pid)
    finally:
        sup.close()


def _idle(pid: int) -> int:
    """The worker's resident memory once it has settled (two readings within 1 MiB)."""
    deadline = time.monotonic() + 30
    last = rss(pid)
    while True:
        time.sleep(0.5)
        now = rss(pid)
        if abs(now - last) < MIB or time.monotonic() > deadline:
            return now
        last = now


def test_a_reflection_stream_that_never_reads_costs_a_bounded_amount(
    worker: tuple[Supervisor, int],
) -> None:
    """Each answer waits for the peer's window (a send above the stream's mark waits),
    the handler yields between answers and stops when the peer leaves."""
    sup, pid = worker
    idle = _idle(pid)
    with Victim(sup.port) as victim, Meter(pid) as meter:
        flood = asyncio.run(reflection_flood(sup.port, seconds=5, max_bytes=16 * MIB))
    assert flood.sent > 0
    assert meter.peak - idle < PEAK_BOUND, f"peak {(meter.peak - idle) / MIB:.0f} MiB over idle"
    assert victim.p99() < P99_BOUND, f"victim p99 {victim.p99():.3f} s"
    assert not victim.failures
    assert quiet(pid, timeout=30) < 10, "the worker kept working after the peer left"


@pytest.mark.timeout(240)
def test_held_bodies_past_the_budget_are_cut_off_and_given_back(
    worker: tuple[Supervisor, int],
) -> None:
    """120 x 4 unfinished 3.9 MiB bodies: past the worker's budget the holders lose
    their streams or connections; the memory goes back once they are gone."""
    sup, pid = worker
    idle = _idle(pid)

    def settled(result: HoldResult) -> bool:
        return result.holding + STREAMS * result.cut_off >= CONNECTIONS * STREAMS

    with Victim(sup.port) as victim, Meter(pid) as meter:
        result = asyncio.run(
            held_bodies(sup.port, CONNECTIONS, STREAMS, int(3.9 * MIB), settled, timeout=90)
        )
    assert settled(result), result
    assert result.refused or result.cut_off, "nobody was refused: the budget never bit"
    assert meter.peak - idle < PEAK_BOUND, f"peak {(meter.peak - idle) / MIB:.0f} MiB over idle"
    assert victim.p99() < P99_BOUND, f"victim p99 {victim.p99():.3f} s"
    after = settle(pid, lambda now: now - idle < AFTER_BOUND, timeout=60)
    assert after - idle < AFTER_BOUND, f"{(after - idle) / MIB:.0f} MiB kept after the peers left"
