"""Mesh scale: N simulated sidecar Envoys against one mgmt-api process.

    uv run --frozen python bench/mesh/scale.py [--sizes 50,200,500,2000] [--idle 20]

For each N (services = N/10, over 10 namespaces), a fresh ``mgmt-api serve``
(SQLite, as a one-process install runs it) with one cluster whose agent
reports N pods and the issuer their workload tokens are minted with; then N
simulated sidecars (:mod:`tests.support.ads_sim`: real gRPC, one ADS stream
each, subscribing and ACKing as Envoy does, 20 streams per HTTP/2
connection) all start at once. Measured, on mgmt-api's process only
(``/proc``):

- **join storm**: seconds from the first stream opening until every sidecar
  has ACKed, on every type, one version whose clusters hold all N endpoints;
  mgmt-api's CPU seconds for it;
- **idle CPU**: cores used over ``--idle`` seconds with nothing changing;
- **policy change**: the cluster's ext_authz timeout changes over REST (every
  sidecar's input digest changes); seconds from the write's answer until
  each sidecar ACKed the new version (p50, p99, max) and CPU seconds;
- **join / leave**: one more sidecar opens its stream, then closes it;
  seconds until a sidecar of another service sees its endpoint appear, then
  disappear;
- **RSS** at the end.

The clients share the machine (and its 2 cores) with mgmt-api; their CPU is
not counted, but wall times include waiting for them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import signal  # noqa: E402
import subprocess  # noqa: E402

import grpc  # noqa: E402
import httpx  # noqa: E402

from tests.mgmt_api.harness import MgmtServer, ok  # noqa: E402
from tests.support import gateway as gateway_support  # noqa: E402
from tests.support import mesh as mesh_support  # noqa: E402
from tests.support.ads_sim import LISTENER, MeshCluster, SimSidecar, sidecar  # noqa: E402
from tests.support.workload_tokens import PodRef, TestIssuer  # noqa: E402

PER_CHANNEL = 20
NAMESPACES = 10
BASE_PORT = 20000
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class SampledServer(MgmtServer):
    """mgmt-api under ``bench/mesh/sampled_serve.py`` (``--profile``): a window's
    stack samples go to ``PREFIX-WINDOW.self`` / ``.total``."""

    def __init__(self, prefix: str) -> None:
        super().__init__(None)
        self.prefix = prefix

    def start(self) -> MgmtServer:
        real = subprocess.Popen

        def popen(args: list[str], **kwargs: Any) -> Any:
            sampler = str(ROOT / "bench/mesh/sampled_serve.py")
            return real([args[0], sampler, self.prefix, *args[3:]], **kwargs)

        # The harness starts mgmt-api with subprocess.Popen: the sampler runs it instead.
        with mock.patch.object(subprocess, "Popen", popen):
            return super().start()


class Window:
    """Profiles one phase when the server samples (no-op otherwise)."""

    def __init__(self, server: MgmtServer, name: str) -> None:
        self.server, self.name = server, name

        self.perf: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> None:
        if isinstance(self.server, SampledServer) and self.server.proc is not None:
            self.server.proc.send_signal(signal.SIGUSR1)
            # CPU samples of the whole process, C included (gRPC's core, the loop)
            out = f"{self.server.prefix}-{self.name}.perf"
            self.perf = subprocess.Popen(
                ["perf", "record", "-F", "499", "-g", "-p", str(self.server.proc.pid), "-o", out],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

    def __exit__(self, *_: object) -> None:
        if self.perf is not None:
            self.perf.send_signal(signal.SIGINT)
            self.perf.wait(30)
        if isinstance(self.server, SampledServer) and self.server.proc is not None:
            # the sampler writes PREFIX.self/.total; keep them per window
            self.server.proc.send_signal(signal.SIGUSR2)
            time.sleep(0.5)
            for suffix in ("self", "total"):
                path = Path(f"{self.server.prefix}.{suffix}")
                if path.exists():
                    path.rename(f"{self.server.prefix}-{self.name}.{suffix}")


class EnvoyPlane:
    """What a real sidecar (:class:`tests.support.mesh.Workload`) needs of the bench."""

    def __init__(self, server: MgmtServer, issuer: TestIssuer, tmp: Path) -> None:
        self.server, self.issuer, self.tmp = server, issuer, tmp

    @property
    def control_plane(self) -> str:
        return f"grpc://127.0.0.1:{self.server.grpc_port}"

    def agent_args(self) -> list[str]:
        return []

    def agent_env(self) -> dict[str, str] | None:
        return None


def envoy_versions(real: mesh_support.Workload) -> dict[str, str]:
    """The real Envoy's last accepted version of each type (its ``version_text`` readouts)."""
    text = real.admin("GET", "/stats?filter=version_text").text
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(": ")
        out[name.strip()] = value.strip().strip('"')
    return out


def envoy_listeners(real: mesh_support.Workload) -> str:
    """The real Envoy's listeners' version (its routes' are per route configuration:
    one whose bytes did not change keeps its version)."""
    return envoy_versions(real).get("listener_manager.lds.version_text", "")


class EnvoyWatch:
    """Polls the real Envoy (in a thread) until its listener version moves off ``before``."""

    def __init__(self, real: mesh_support.Workload, before: str) -> None:
        self.real, self.before = real, before
        self.seen = before
        self.at = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._stop = threading.Event()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            now = envoy_listeners(self.real)
            if now != self.before:
                self.seen, self.at = now, time.monotonic()
                return
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def pods(n: int) -> list[PodRef]:
    services = max(1, n // 10)
    out = []
    for i in range(n):
        service = i % services
        ns = f"ns{service % NAMESPACES}"
        out.append(PodRef(ns, f"svc{service}-{i}", f"svc{service}", services=(f"svc{service}",)))
    return out


class Fleet:
    """The simulated sidecars and their channels, on this process's loop."""

    def __init__(self, server: MgmtServer, cluster: MeshCluster, issuer: TestIssuer) -> None:
        self.server, self.cluster, self.issuer = server, cluster, issuer
        self.sims: list[SimSidecar] = []
        self.channels: list[grpc.aio.Channel] = []
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, pod: PodRef, port: int, parse: bool) -> SimSidecar:
        sim = sidecar(self.cluster.org, self.cluster.name, pod, port, self.issuer)
        sim.parse_clusters = parse
        if len(self.sims) % PER_CHANNEL == 0:
            self.channels.append(grpc.aio.insecure_channel(f"127.0.0.1:{self.server.grpc_port}"))
        self.sims.append(sim)
        self.tasks.append(asyncio.create_task(sim.run(self.channels[-1])))
        return sim

    async def close(self) -> None:
        for sim in self.sims:
            sim.close()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for channel in self.channels:
            await channel.close()


async def until(predicate: Callable[[], bool], limit: float, what: str) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > limit:
            raise TimeoutError(f"{what}: not within {limit}s")
        await asyncio.sleep(0.005)
    return time.monotonic() - start


async def applied_desired(
    admin: httpx.Client, cluster: str, instances: dict[str, str], limit: float
) -> dict[str, bool]:
    """``<name>_applied_desired`` for each of ``instances`` (name → instance): whether
    it reports, within ``limit`` seconds, the sidecar version mgmt-api wants (the
    last event's ACK may still be on its way when this is first asked)."""

    def status() -> dict[str, bool]:
        body = ok(admin.get(f"/v2/{cluster}/status"))
        desired = body["desiredVersions"]["sidecar"]
        applied = {i["instance"]: i["appliedVersion"] for i in body["instances"]}
        return {f"{k}_applied_desired": applied.get(v) == desired for k, v in instances.items()}

    start = time.monotonic()
    while not all((seen := await asyncio.to_thread(status)).values()):
        if time.monotonic() - start > limit:
            break
        await asyncio.sleep(0.1)
    return seen


def total_endpoints(sim: SimSidecar) -> int:
    return sum(len(v) for k, v in sim.endpoints.items() if k.startswith("outbound/"))


def start_server(profile: str, n: int) -> MgmtServer:
    """mgmt-api, started again when it misses the harness's deadlines (a loaded box)."""
    for attempt in range(3):
        try:
            return (SampledServer(f"{profile}-{n}") if profile else MgmtServer(None)).start()
        except RuntimeError:
            if attempt == 2:
                raise
            print("mgmt-api did not start in time; again", file=sys.stderr, flush=True)
    raise AssertionError("unreachable")


def until_sync(predicate: Any, limit: float) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("not within {limit}s")
        time.sleep(0.02)


def quantiles(delays: list[float], name: str) -> dict[str, float]:
    delays = sorted(delays)
    return {
        f"{name}_p50": round(statistics.median(delays), 3),
        f"{name}_p99": round(delays[min(len(delays) - 1, int(len(delays) * 0.99))], 3),
        f"{name}_max": round(delays[-1], 3),
    }


async def moved_everywhere(
    sims: list[SimSidecar], probe: SimSidecar, before: str, since: float, limit: float, what: str
) -> list[float]:
    """Seconds from ``since`` until each of ``sims`` ACKed the version ``probe`` moves to
    (versions are per stream: a sidecar that joined later may label the same routes
    otherwise, so only sidecars that were there together are compared)."""
    await until(lambda: probe.version not in ("", before), limit, what)
    new = probe.version
    # Each one's version now (a leave returns to the version before the join).
    await until(lambda: all(s.version == new for s in sims), limit, what)
    return [s.converged_at[new] - since for s in sims]


async def one_size(n: int, idle: float, limit: float, profile: str, envoy: bool) -> dict[str, Any]:
    issuer = TestIssuer("https://kubernetes.default.svc")
    server = start_server(profile, n)
    tmp = Path(tempfile.mkdtemp(prefix="mesh-scale-"))
    real = (
        mesh_support.Workload(EnvoyPlane(server, issuer, tmp), "svc0", "ns0", "svc0")
        if envoy
        else None
    )
    try:
        assert server.proc is not None
        pid = server.proc.pid
        print(f"n={n}: mgmt-api pid {pid}", file=sys.stderr, flush=True)
        with server.admin() as admin:
            org, name = gateway_support.ORG, gateway_support.CLUSTER  # the real sidecar's
            ok(admin.post("/v2/organizations", json={"name": org, "organization": {}}))
            cluster = MeshCluster(server, admin, org, name)
            everyone = pods(n + 1)  # the last one joins and leaves later
            cluster.report(issuer, everyone + ([real.pod] if real is not None else []))
            fleet = Fleet(server, cluster, issuer)
            probe_every = max(1, n // 5)
            # ---- cold join storm
            storm_window = Window(server, "storm")
            storm_window.__enter__()
            cpu0, t0, own0 = cpu_seconds(pid), time.monotonic(), time.process_time()
            for i, pod in enumerate(everyone[:n]):
                fleet.start(pod, BASE_PORT + i, parse=i < 3 or i % probe_every == 0)
            probes = [s for s in fleet.sims if s.parse_clusters]

            def converged() -> bool:
                target = probes[0].version
                if not target or any(total_endpoints(p) != n for p in probes):
                    return False
                return all(s.version == target for s in fleet.sims)

            def errors() -> list[str]:
                return [s.error for s in fleet.sims if s.error]

            try:
                storm = await until(lambda: converged() or bool(errors()), limit, "join storm")
            except TimeoutError:
                done = sum(1 for s in fleet.sims if s.version == probes[0].version)
                return {"n": n, "storm": None, "note": f"{done}/{n} converged in {limit}s"}
            if errors():
                return {"n": n, "storm": None, "note": errors()[0]}
            storm_cpu = cpu_seconds(pid) - cpu0
            storm_clients_cpu = time.process_time() - own0
            storm_window.__exit__()
            extra: dict[str, Any] = {}
            endpoints = n
            if real is not None:  # one real Envoy joins (one more endpoint of svc0)
                before, started = probes[0].version, time.monotonic()
                real.start()
                await moved_everywhere(fleet.sims, probes[0], before, started, limit, "envoy join")
                endpoints += 1
                await until(lambda: all(total_endpoints(p) == endpoints for p in probes), 60, "+1")
                await until(
                    lambda: envoy_listeners(real) == probes[0].acked[LISTENER],
                    60,
                    "the real Envoy's versions",
                )
                extra["envoy_join"] = round(time.monotonic() - started, 2)
            # ---- idle
            await asyncio.sleep(2)  # the storm's tail (refreshes, logs) settles
            cpu1, t1 = cpu_seconds(pid), time.monotonic()
            with Window(server, "idle"):
                await asyncio.sleep(idle)
            idle_cores = (cpu_seconds(pid) - cpu1) / (time.monotonic() - t1)
            # ---- one policy change
            current = ok(admin.get(f"/v2/{cluster.fqn}"))
            before = probes[0].version
            watch = EnvoyWatch(real, envoy_listeners(real)) if real is not None else None
            cpu2, own2 = cpu_seconds(pid), time.process_time()
            change_window = Window(server, "change")
            change_window.__enter__()
            ok(
                admin.put(
                    f"/v2/{cluster.fqn}",
                    json={"extAuthz": {"timeout": "0.25s"}, "etag": current["etag"]},
                )
            )
            written = time.monotonic()
            delays = await moved_everywhere(fleet.sims, probes[0], before, written, limit, "change")
            change_cpu = cpu_seconds(pid) - cpu2
            clients_cpu = time.process_time() - own2
            change_window.__exit__()
            if watch is not None:
                await asyncio.to_thread(until_sync, lambda: watch.at > 0, 60)
                watch.stop()
                extra["envoy_change"] = round(watch.at - written, 3)
                sim = probes[0].acked[LISTENER]
                extra["envoy_same_version"] = watch.seen == sim or [watch.seen, sim]
            # ---- join and leave (a sidecar of another service watches)
            joiner = everyone[n]
            watcher = next(p for p in probes if p.node.service != joiner.services[0])
            name = f"outbound/{joiner.namespace}/{joiner.services[0]}"
            port = BASE_PORT + n
            count = len(watcher.endpoints.get(name, []))
            cpu3 = cpu_seconds(pid)
            join_window = Window(server, "join")
            join_window.__enter__()
            before, started = probes[0].version, time.monotonic()
            others = list(fleet.sims)
            late = fleet.start(joiner, port, parse=False)
            join = await until(lambda: port in watcher.endpoints.get(name, []), 60, "the join")
            joins = await moved_everywhere(others, probes[0], before, started, limit, "join")
            await until(lambda: bool(late.version), 60, "the joiner's configuration")
            fleet.sims.remove(late)
            before, started = probes[0].version, time.monotonic()
            late.close()
            leave = await until(lambda: port not in watcher.endpoints.get(name, []), 60, "leave")
            leaves = await moved_everywhere(others, probes[0], before, started, limit, "leave")
            join_leave_cpu = cpu_seconds(pid) - cpu3
            join_window.__exit__()
            assert len(watcher.endpoints.get(name, [])) == count
            rss = rss_mb(pid)
            if real is not None:  # the real Envoy applies what mgmt-api wants (its status)
                instances = {"envoy": real.node.instance, "sims": probes[0].node.instance}
                extra.update(await applied_desired(admin, cluster.fqn, instances, limit))
            await fleet.close()
            return {
                "n": n,
                "services": max(1, n // 10),
                "storm": round(storm, 2),
                "storm_cpu": round(storm_cpu, 2),
                "storm_clients_cpu": round(storm_clients_cpu, 2),
                "idle_cores": round(idle_cores, 3),
                **quantiles(delays, "change"),
                "change_cpu": round(change_cpu, 2),
                "change_clients_cpu": round(clients_cpu, 2),
                "join": round(join, 3),
                "leave": round(leave, 3),
                **quantiles(joins, "join_all"),
                **quantiles(leaves, "leave_all"),
                "join_leave_cpu": round(join_leave_cpu, 2),
                "rss_mb": round(rss),
                "storm_started": round(t0, 1),
                **extra,
            }
    finally:
        if real is not None:
            real.stop()
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="50,200,500,2000")
    parser.add_argument("--idle", type=float, default=20.0)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--no-envoy", action="store_true", help="simulated sidecars only")
    parser.add_argument("--profile", default="", help="write stack samples per phase to PREFIX-N-*")
    args = parser.parse_args()
    for n in (int(s) for s in args.sizes.split(",")):
        result = asyncio.run(one_size(n, args.idle, args.timeout, args.profile, not args.no_envoy))
        result.pop("storm_started", None)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
