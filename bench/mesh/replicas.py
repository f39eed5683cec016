"""The mesh's changes across mgmt-api replicas: two replicas, one PostgreSQL.

    uv run --frozen python bench/mesh/replicas.py [--sizes 100,400] [--rounds 100] [--control]

For each N (services = N/10, over 10 namespaces): a throwaway PostgreSQL
(:mod:`tests.support.postgres`) and two ``mgmt-api serve`` replicas A and B
on one fresh database of it, their revision poll off
(``MESHPLANE_REVISION_POLL=1h``), so only PostgreSQL ``NOTIFY`` carries a
change from one to the other. One cluster whose agent reports N + 1 pods and
the issuer their workload tokens are minted with; N simulated sidecars
(:mod:`tests.support.ads_sim`, as in ``bench/mesh/scale.py``) stream, the
even ones from A and the odd ones from B. Every event starts on A, and is
repeated ``--rounds`` times, one at a time:

- **policy change**: the cluster's ext_authz timeout over REST on A; from
  the write's answer until each sidecar ACKed the new listeners;
- **join**: one more simulated sidecar opens its stream on A; from then
  until each sidecar ACKed the endpoints (EDS) that hold it;
- **leave**: that sidecar closes its stream; until each sidecar ACKed the
  endpoints without it.

A sidecar's delay is its ACK of the new version of that type (on one in
:data:`PROBE_EVERY` per replica, the endpoints are parsed and checked to
hold, or not hold, the joiner). Each event is reported for the sidecars on
A and those on B apart (p50, p99, max of every sidecar's delay over every
round), and as the cross-replica part: per round, B's median delay minus
A's (and B's slowest minus A's slowest), over the rounds. Each replica
debounces its own input (0.1 s of quiet,
:data:`mgmt_api.distribution.sidecar_ads.DEBOUNCE_SECONDS`), so every
absolute delay holds ~0.1 s of waiting on either side; the cross-replica
part is what B adds: the ``NOTIFY``, B's store read and build. One
direction is enough: the replicas are the same program and either one's
writes ``NOTIFY`` the other alike. ``--control`` streams B's half from A
too (B still runs): the delta is then the noise of measuring two halves of
one replica's sidecars. A third session listens (``LISTEN``) on both
channels, on a thread of its own, and reports when the ``NOTIFY`` that
wakes B reached it (from the same start as the event's delays: for a
change, the write's answer, so it is below zero when heard before it).

Beside the wall times: each replica's CPU seconds per event (``/proc``), and
the load average at the start and the end. The clients share the machine
with both replicas and PostgreSQL; their CPU is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.mesh.scale import (  # noqa: E402
    BASE_PORT,
    Fleet,
    cpu_seconds,
    pods,
    quantiles,
    total_endpoints,
    until,
)
from mgmt_api.store.notify import REVISION_CHANNEL, SIDECARS_CHANNEL, libpq_url  # noqa: E402
from tests.mgmt_api.harness import MgmtServer, ok  # noqa: E402
from tests.support.ads_sim import ENDPOINT, LISTENER, MeshCluster, SimSidecar  # noqa: E402
from tests.support.postgres import PostgresServer, find_bin_dir  # noqa: E402
from tests.support.workload_tokens import PodRef, TestIssuer  # noqa: E402

#: Between two rounds: longer than a debounce, so no two events share a push.
PAUSE = 0.3
#: The cross-replica target: what B's sidecars may wait beyond A's (p99).
TARGET = 0.1
#: The ext_authz timeouts a policy change alternates between.
TIMEOUTS = ("0.25s", "0.5s")
#: One sidecar in this many on each replica parses its endpoints and checks them; the
#: others follow the endpoints' version (the bench's own CPU would otherwise be most
#: of the wall time: every sidecar parses every endpoint on each move).
PROBE_EVERY = 5


@dataclass
class Event:
    """One kind of event's samples over its rounds."""

    name: str
    on_a: list[float] = field(default_factory=list)  # every sidecar on A, every round
    on_b: list[float] = field(default_factory=list)
    median_delta: list[float] = field(default_factory=list)  # per round, B's minus A's
    last_delta: list[float] = field(default_factory=list)  # per round, slowest B - slowest A
    notified: list[float] = field(default_factory=list)  # per round, the NOTIFY heard
    cpu_a: float = 0.0
    cpu_b: float = 0.0

    def record(self, on_a: list[float], on_b: list[float]) -> None:
        self.on_a += on_a
        self.on_b += on_b
        self.median_delta.append(statistics.median(on_b) - statistics.median(on_a))
        self.last_delta.append(max(on_b) - max(on_a))

    def summary(self, rounds: int) -> dict[str, Any]:
        return {
            **quantiles(self.on_a, f"{self.name}_a"),
            **quantiles(self.on_b, f"{self.name}_b"),
            **quantiles(self.median_delta, f"{self.name}_delta"),
            f"{self.name}_delta_min": round(min(self.median_delta), 3),
            f"{self.name}_rounds_over_target": sum(d > TARGET for d in self.median_delta),
            **quantiles(self.last_delta, f"{self.name}_delta_last"),
            **(quantiles(self.notified, f"{self.name}_notify") if self.notified else {}),
            f"{self.name}_cpu_a": round(self.cpu_a / rounds, 3),
            f"{self.name}_cpu_b": round(self.cpu_b / rounds, 3),
        }


class Listener:
    """A third session's ``LISTEN`` on both channels, on a thread of its own: when the
    ``NOTIFY`` that wakes B reaches a listening session (PostgreSQL's hop, apart from
    B's own scheduling)."""

    def __init__(self, url: str) -> None:
        self.heard: list[float] = []
        self._conn = psycopg.connect(libpq_url(url), autocommit=True)
        for channel in (REVISION_CHANNEL, SIDECARS_CHANNEL):
            self._conn.execute(f"LISTEN {channel}")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for _ in self._conn.notifies(timeout=0.2):
                self.heard.append(time.monotonic())

    def first_after(self, since: float) -> float | None:
        """When the first notice after ``since`` was heard (None: not yet)."""
        return next((t for t in self.heard if t >= since), None)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._conn.close()


class Replicas:
    """Replicas A and B, their sidecars, and what a round measures on them."""

    def __init__(
        self, a: MgmtServer, b: MgmtServer, fleet_a: Fleet, fleet_b: Fleet, listener: Listener
    ) -> None:
        self.a, self.b = a, b
        self.fleet_a, self.fleet_b = fleet_a, fleet_b
        self.listener = listener

    @property
    def pids(self) -> tuple[int, int]:
        assert self.a.proc is not None and self.b.proc is not None
        return self.a.proc.pid, self.b.proc.pid

    @contextmanager
    def cpu(self, event: Event) -> Iterator[None]:
        """Adds both replicas' CPU seconds over the block to ``event``'s."""
        a, b = self.pids
        a0, b0 = cpu_seconds(a), cpu_seconds(b)
        yield
        event.cpu_a += cpu_seconds(a) - a0
        event.cpu_b += cpu_seconds(b) - b0

    @property
    def sims(self) -> list[SimSidecar]:
        return self.fleet_a.sims + self.fleet_b.sims

    def acked(self, type_url: str) -> dict[int, str]:
        """Each sidecar's last ACKed version of ``type_url``, before an event."""
        return {id(s): s.acked[type_url] for s in self.sims}

    async def delivered(
        self,
        event: Event,
        begun: float,
        since: float,
        type_url: str,
        before: dict[int, str],
        holds: Callable[[SimSidecar], bool],
        limit: float,
    ) -> None:
        """Wait until every sidecar ACKed a new version of ``type_url`` (and, on those
        that parse what they get, ``holds``); record, for each, that ACK less ``since``,
        and when the first ``NOTIFY`` after ``begun`` was heard, less ``since``."""

        def done(s: SimSidecar) -> bool:
            return s.acked[type_url] != before[id(s)] and (not s.parse_clusters or holds(s))

        sims = self.sims
        await until(lambda: all(done(s) for s in sims), limit, event.name)
        event.record(
            [s.acked_at[type_url] - since for s in self.fleet_a.sims],
            [s.acked_at[type_url] - since for s in self.fleet_b.sims],
        )
        heard = self.listener.first_after(begun)
        if heard is not None:
            event.notified.append(heard - since)


async def policy_round(
    replicas: Replicas, event: Event, admin: Any, fqn: str, authz_timeout: str, limit: float
) -> None:
    """The cluster's ext_authz timeout, written on A, until every sidecar has it."""
    current = ok(admin.get(f"/v2/{fqn}"))
    before = replicas.acked(LISTENER)
    with replicas.cpu(event):
        begun = time.monotonic()
        ok(
            admin.put(
                f"/v2/{fqn}", json={"extAuthz": {"timeout": authz_timeout}, "etag": current["etag"]}
            )
        )
        written = time.monotonic()
        await replicas.delivered(event, begun, written, LISTENER, before, lambda _: True, limit)


async def join_leave_round(
    replicas: Replicas, join: Event, leave: Event, joiner: PodRef, limit: float
) -> None:
    """One more sidecar joins on A until every sidecar holds it, then leaves until none does."""
    port = BASE_PORT + 10_000
    name = f"outbound/{joiner.namespace}/{joiner.services[0]}"

    def holds(s: SimSidecar) -> bool:
        return port in s.endpoints.get(name, [])

    before = replicas.acked(ENDPOINT)
    with replicas.cpu(join):
        started = time.monotonic()
        late = replicas.fleet_a.start(joiner, port, parse=False)
        replicas.fleet_a.sims.remove(late)  # not a watcher
        await replicas.delivered(join, started, started, ENDPOINT, before, holds, limit)
    await until(lambda: bool(late.version or late.error), limit, "the joiner's configuration")
    if late.error:
        raise RuntimeError(late.error)
    await asyncio.sleep(PAUSE)
    before = replicas.acked(ENDPOINT)
    with replicas.cpu(leave):
        started = time.monotonic()
        late.close()
        await replicas.delivered(
            leave, started, started, ENDPOINT, before, lambda s: not holds(s), limit
        )


async def measure(
    replicas: Replicas, admin: Any, fqn: str, joiner: PodRef, rounds: int, limit: float
) -> list[Event]:
    """Each event ``rounds`` times, one at a time: policy changes, then joins and leaves."""
    change, join, leave = Event("change"), Event("join"), Event("leave")
    for i in range(rounds):
        await asyncio.sleep(PAUSE)
        await policy_round(replicas, change, admin, fqn, TIMEOUTS[i % 2], limit)
    for _ in range(rounds):
        await asyncio.sleep(PAUSE)
        await join_leave_round(replicas, join, leave, joiner, limit)
    return [change, join, leave]


def start_replica(url: str) -> MgmtServer:
    """A replica on ``url``; only ``NOTIFY`` tells it of the other's writes."""
    return MgmtServer(database_url=url, env={"MESHPLANE_REVISION_POLL": "1h"}).start()


async def one_size(n: int, rounds: int, limit: float, control: bool) -> dict[str, Any]:
    bin_dir = find_bin_dir()
    if bin_dir is None:
        raise SystemExit("no PostgreSQL binaries (initdb/postgres) on this machine")
    issuer = TestIssuer("https://kubernetes.default.svc")
    postgres = PostgresServer(bin_dir).start()
    started: list[MgmtServer] = []
    listener: Listener | None = None
    try:
        url = postgres.new_database()
        listener = Listener(url)
        started.append(start_replica(url))
        started.append(start_replica(url))
        a, b = started
        load_start = os.getloadavg()[0]
        with a.admin() as admin:
            org, name = "bench", "c1"
            ok(admin.post("/v2/organizations", json={"name": org, "organization": {}}))
            cluster = MeshCluster(a, admin, org, name)
            everyone = pods(n + 1)  # the last one joins and leaves
            cluster.report(issuer, everyone)
            second = Fleet(a if control else b, cluster, issuer)
            replicas = Replicas(a, b, Fleet(a, cluster, issuer), second, listener)
            for i, pod in enumerate(everyone[:n]):
                fleet = replicas.fleet_a if i % 2 == 0 else replicas.fleet_b
                fleet.start(pod, BASE_PORT + i, parse=i // 2 % PROBE_EVERY == 0)
            sims = replicas.sims
            probes = [s for s in sims if s.parse_clusters]

            def converged() -> bool:
                if any(total_endpoints(p) != n for p in probes):
                    return False
                return all(s.acked.get(ENDPOINT) == probes[0].acked[ENDPOINT] for s in sims)

            t0 = time.monotonic()
            await until(
                lambda: converged() or any(s.error for s in sims),
                limit,
                "the sidecars' first configuration",
            )
            errors = [s.error for s in sims if s.error]
            if errors:
                raise RuntimeError(errors[0])
            storm = time.monotonic() - t0
            events = await measure(replicas, admin, cluster.fqn, everyone[n], rounds, limit)
            await replicas.fleet_a.close()
            await replicas.fleet_b.close()
        return {
            "n": n,
            "services": max(1, n // 10),
            "rounds": rounds,
            "control": control,
            "converged": round(storm, 2),
            **{k: v for e in events for k, v in e.summary(rounds).items()},
            "load_start": round(load_start, 2),
            "load_end": round(os.getloadavg()[0], 2),
        }
    finally:
        if listener is not None:
            listener.close()
        for server in started:
            server.close()
        postgres.stop()


def table(result: dict[str, Any]) -> str:
    """The result as docs/benchmarks.md's table's rows (milliseconds)."""

    def ms(*keys: str) -> str:
        return " / ".join(f"{result[k] * 1000:.0f}" if k in result else "—" for k in keys)

    rows = []
    for e in ("change", "join", "leave"):
        cells = [
            e,
            ms(f"{e}_notify_p50", f"{e}_notify_p99"),
            ms(f"{e}_a_p50", f"{e}_a_p99", f"{e}_a_max"),
            ms(f"{e}_b_p50", f"{e}_b_p99", f"{e}_b_max"),
            ms(f"{e}_delta_min", f"{e}_delta_p50", f"{e}_delta_p99")
            + f" ({ms(f'{e}_delta_last_p50', f'{e}_delta_last_p99')})",
            str(result[f"{e}_rounds_over_target"]),
            ms(f"{e}_cpu_a", f"{e}_cpu_b"),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument(
        "--control",
        action="store_true",
        help="B's half of the sidecars streams from A too (what the delta is without B)",
    )
    args = parser.parse_args()
    for n in (int(s) for s in args.sizes.split(",")):
        result = asyncio.run(one_size(n, args.rounds, args.timeout, args.control))
        print(json.dumps(result), flush=True)
        print(table(result), flush=True)


if __name__ == "__main__":
    main()
