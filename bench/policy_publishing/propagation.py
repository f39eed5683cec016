"""Policy propagation latency: from the 200 of a PUT to the first decision that reflects it.

    uv run python -m bench.policy_publishing.propagation [--subscribers 10] [--updates 200]
    uv run python -m bench.policy_publishing.propagation --replicas 2 \
        --postgres postgresql://postgres@127.0.0.1:5432/postgres

With ``--replicas N`` (PostgreSQL only) N ``mgmt-api`` replicas share one
fresh database created on the ``--postgres`` server (and dropped at the end);
PUTs go to replica 0 and subscribers are spread over the replicas round
robin, so the samples of subscribers on other replicas measure a write
crossing replicas (PostgreSQL ``NOTIFY``), and those on replica 0 the
in-process path.

Starts ``mgmt-api serve`` (SQLite) and N real ``ratelimit serve`` processes
subscribed with ``--control-plane`` (each its own supervisor, subscriber and
worker, as in production), seeds the demo cluster with
:mod:`demo.seed`, then does U updates of its BackendTrafficPolicy,
each changing the limit (1001, 1002, ...). After each PUT returns 200 every
subscriber is polled with ShouldRateLimit (the descriptor Envoy sends for the
route) in a tight loop until the reported ``current_limit`` is the new one;
the sample is the time from the 200 to that answer. Updates are sequential:
the next PUT starts once all subscribers reflect the previous one.

Prints p50 / p99 / max over all samples and per subscriber, with the load
average (the machine may be shared), as markdown; writes JSON to
bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import psycopg
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from demo.seed import DemoPlan, credential_files, demo_plan, seed
from meshplane.control_plane import load_credentials
from meshplane.proto.distribution.v1 import distribution_pb2 as dpb
from meshplane.proto.distribution.v1 import distribution_pb2_grpc as dpb_grpc

FIRST_LIMIT = 1000
POLL_PAUSE = 0.001  # between two polls of one subscriber
ADMIN_PASSWORD = "propagation-bench-admin"  # a throw-away local server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on 127.0.0.1:{port}") from None
            time.sleep(0.05)


class Mgmt:
    """``mgmt-api serve`` on SQLite in ``work``, as a subprocess (the bench's own
    launcher: benches do not depend on the test suite's harness)."""

    def __init__(self, work: Path, database: str | None = None, index: int = 0) -> None:
        self.port, self.grpc_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "MESHPLANE_DATA_DIR": str(work)}
        env["MESHPLANE_ADMIN_PASSWORD"] = ADMIN_PASSWORD
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "mgmt_api.cli", "serve",
                "--listen", f"127.0.0.1:{self.port}",
                "--database", database or f"sqlite+pysqlite:///{work / 'mgmt-api.db'}",
                "--grpc-listen", f"127.0.0.1:{self.grpc_port}",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(work / f"mgmt-api-{index}.log", "ab"),  # noqa: SIM115
        )  # fmt: skip
        wait_for_port(self.port, timeout=60)
        deadline = time.monotonic() + 30
        while httpx.get(self.url + "/readyz", timeout=5).status_code != 200:
            if time.monotonic() > deadline:
                raise TimeoutError("mgmt-api never became ready")
            time.sleep(0.05)

    def admin(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, auth=("admin", ADMIN_PASSWORD), timeout=30)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(statistics.median(values) * 1000, 1),
        "p99_ms": round(percentile(values, 99) * 1000, 1),
        "max_ms": round(max(values) * 1000, 1),
    }


def rate_limit_request(plan: DemoPlan) -> rls_pb2.RateLimitRequest:
    request = rls_pb2.RateLimitRequest(domain=plan.rate_limit_domain)
    for entries in plan.rate_limit_descriptors:
        descriptor = ratelimit_pb2.RateLimitDescriptor()
        for key, value in entries:
            descriptor.entries.add(key=key, value=value)
        request.descriptors.append(descriptor)
    return request


def start_subscriber(
    work: Path, index: int, grpc_port: int, credentials: Path, plan: DemoPlan
) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    log = open(work / f"ratelimit-{index}.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "ratelimit.cli", "serve", "--listen", f"127.0.0.1:{port}",
            "--control-plane", f"grpc://127.0.0.1:{grpc_port}",
            "--cluster", f"{plan.organization}/{plan.cluster}",
            "--credentials", str(credentials), "--cache-dir", str(work / f"cache-{index}"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )  # fmt: skip
    return proc, port


async def wait_limit(
    stub: rls_pb2_grpc.RateLimitServiceStub,
    request: rls_pb2.RateLimitRequest,
    limit: int,
    started: float,
    deadline: float = 30.0,
) -> float:
    """Poll until a decision carries ``limit``; return seconds since ``started``."""
    while True:
        response = await stub.ShouldRateLimit(request, timeout=5)
        now = time.perf_counter()
        statuses = response.statuses
        if statuses and statuses[0].current_limit.requests_per_unit == limit:
            return now - started
        if now - started > deadline:
            raise TimeoutError(f"limit {limit} not seen after {deadline} s")
        await asyncio.sleep(POLL_PAUSE)


def traffic_spec(limit: int) -> dict[str, Any]:
    return {
        "spec": {
            "targetRef": {"kind": "HTTPRoute", "name": "web"},
            "rateLimit": {
                "type": "Global",
                "global": {"rules": [{"limit": {"requests": limit, "unit": "Hour"}}]},
            },
        }
    }


class StreamProbe:
    """A raw policy stream to the last replica: when does each new snapshot arrive?

    Measures the stream alone (no subscriber applying the snapshot), the part
    a cross-replica notification speeds up.
    """

    def __init__(self, grpc_port: int, plan: DemoPlan, credentials: Path) -> None:
        self.address = f"127.0.0.1:{grpc_port}"
        self.channel: grpc.aio.Channel | None = None
        self.arrivals: dict[bytes, float] = {}
        self.plan, self.credentials = plan, credentials
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        key = load_credentials(self.credentials)
        self.channel = grpc.aio.insecure_channel(self.address)  # on the running loop
        stub = dpb_grpc.PolicyDistributionStub(self.channel)  # type: ignore[no-untyped-call]
        node = dpb.Node(
            kind="ratelimit",
            organization=self.plan.organization,
            cluster=self.plan.cluster,
            instance="bench-probe",
        )

        async def requests() -> Any:
            # The first request names the node; the stream stays open (the
            # server ends it when the subscriber's side closes).
            yield dpb.SnapshotRequest(node=node)
            await asyncio.Event().wait()

        call = stub.StreamSnapshots(
            requests(), metadata=[("authorization", f"Bearer {key.token(ttl=3600)}")]
        )

        async def read() -> None:
            async for snapshot in call:
                now = time.perf_counter()
                for f in snapshot.files:
                    self.arrivals.setdefault(f.content, now)

        self.task = asyncio.create_task(read())

    async def arrival(self, needle: bytes) -> float:
        deadline = time.perf_counter() + 30.0
        while time.perf_counter() < deadline:
            for content, at in self.arrivals.items():
                if needle in content:
                    return at
            if self.task is not None and self.task.done():
                raise RuntimeError(f"the probe's stream ended: {self.task.exception()!r}")
            await asyncio.sleep(0.001)
        raise TimeoutError(f"no snapshot with {needle!r}")

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        if self.channel is not None:
            await self.channel.close()


async def measure(
    mgmt: Mgmt, plan: DemoPlan, ports: list[int], updates: int, probe: StreamProbe | None = None
) -> tuple[list[list[float]], list[float]]:
    request = rate_limit_request(plan)
    stream_samples: list[float] = []
    if probe is not None:
        await probe.start()
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}") for port in ports]
    stubs = [rls_pb2_grpc.RateLimitServiceStub(channel) for channel in channels]
    policy = next(r for r in plan.resources if r.field == "backendTrafficPolicy")
    samples: list[list[float]] = [[] for _ in ports]
    try:
        # Every subscriber serves the seeded limit before the clock starts.
        await asyncio.gather(
            *(wait_limit(s, request, FIRST_LIMIT, time.perf_counter(), 120) for s in stubs)
        )
        auth = ("admin", ADMIN_PASSWORD)
        async with httpx.AsyncClient(base_url=mgmt.url, auth=auth, timeout=30) as client:
            etag = (await client.get(policy.path)).json()["etag"]
            for i in range(updates):
                limit = FIRST_LIMIT + 1 + i
                response = await client.put(policy.path, json={**traffic_spec(limit), "etag": etag})
                started = time.perf_counter()
                if response.status_code != 200:
                    raise RuntimeError(f"PUT failed: {response.status_code} {response.text}")
                etag = response.json()["etag"]
                latencies = await asyncio.gather(
                    *(wait_limit(s, request, limit, started) for s in stubs)
                )
                for column, value in zip(samples, latencies, strict=True):
                    column.append(value)
                if probe is not None:
                    needle = f"requests_per_unit: {limit}\n".encode()
                    stream_samples.append(await probe.arrival(needle) - started)
    finally:
        for channel in channels:
            await channel.close()
        if probe is not None:
            await probe.close()
    return samples, stream_samples


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Database:
    """A fresh database on a PostgreSQL server, dropped on ``drop()``."""

    def __init__(self, server_url: str) -> None:
        self.server_url = server_url
        self.name = f"meshplane_bench_{int(time.time())}"
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {self.name}")
        base, _, _ = server_url.rpartition("/")
        self.url = f"{base}/{self.name}".replace("postgresql://", "postgresql+psycopg://", 1)

    def drop(self) -> None:
        with psycopg.connect(self.server_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")


def run(
    subscribers: int, updates: int, replicas: int = 1, postgres: str | None = None
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="meshplane-propagation-"))
    database = Database(postgres) if postgres else None
    mgmts = [Mgmt(work, database.url if database else None, i) for i in range(replicas)]
    mgmt = mgmts[0]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        plan = demo_plan(requests=FIRST_LIMIT, unit="Hour")
        keys = credential_files(work)
        credentials = keys["ratelimit"]  # the subscribers are ratelimit instances
        with mgmt.admin() as client:
            seed(client, plan, keys)
        ports = []
        for index in range(subscribers):
            grpc_port = mgmts[index % replicas].grpc_port
            proc, port = start_subscriber(work, index, grpc_port, credentials, plan)
            procs.append(proc)
            ports.append(port)
        for port in ports:
            wait_for_port(port, timeout=120)
        load_before = os.getloadavg()
        probe = StreamProbe(mgmts[-1].grpc_port, plan, credentials) if replicas > 1 else None
        samples, stream_samples = asyncio.run(measure(mgmt, plan, ports, updates, probe))
        load_after = os.getloadavg()
    finally:
        for proc in procs:
            stop(proc)
        for replica in mgmts:
            stop(replica.proc)
        if database is not None:
            database.drop()
    everything = [value for column in samples for value in column]
    crossing = [v for i, column in enumerate(samples) if i % replicas for v in column]
    return {
        "subscribers": subscribers,
        "updates": updates,
        "replicas": replicas,
        "store": "postgresql" if database else "sqlite",
        "samples": len(everything),
        "all": summary(everything),
        "same_replica": summary([v for i, c in enumerate(samples) if not i % replicas for v in c]),
        "other_replica": summary(crossing) if crossing else None,
        "other_replica_stream": summary(stream_samples) if stream_samples else None,
        "per_subscriber": [summary(column) for column in samples],
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
        "cpus": os.cpu_count(),
    }


def markdown(result: dict[str, Any]) -> str:
    overall = result["all"]
    lines = [
        f"{result['updates']} updates x {result['subscribers']} subscribers on "
        f"{result['replicas']} replica(s) ({result['store']}) = "
        f"{result['samples']} samples; load average before/after "
        f"{result['loadavg_before'][0]} / {result['loadavg_after'][0]} on {result['cpus']} CPUs",
        "",
        "| | p50 | p99 | max |",
        "|---|---|---|---|",
        f"| all | {overall['p50_ms']} ms | {overall['p99_ms']} ms | {overall['max_ms']} ms |",
    ]
    for label, key in (
        ("written on its replica", "same_replica"),
        ("other replica", "other_replica"),
        ("other replica's stream (snapshot sent)", "other_replica_stream"),
    ):
        row = result.get(key)
        if row and result["replicas"] > 1:
            lines.append(
                f"| {label} | {row['p50_ms']} ms | {row['p99_ms']} ms | {row['max_ms']} ms |"
            )
    for i, row in enumerate(result["per_subscriber"]):
        lines.append(
            f"| subscriber {i} | {row['p50_ms']} ms | {row['p99_ms']} ms | {row['max_ms']} ms |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--subscribers", type=int, default=10)
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument("--replicas", type=int, default=1, help="mgmt-api replicas (PostgreSQL)")
    parser.add_argument(
        "--postgres",
        help="a PostgreSQL server URL (postgresql://user@host:port/db) to create the "
        "bench's database on; default: one SQLite replica",
    )
    args = parser.parse_args()
    if args.replicas > 1 and not args.postgres:
        parser.error("--replicas needs --postgres (replicas share one PostgreSQL database)")
    result = run(args.subscribers, args.updates, args.replicas, args.postgres)
    print(markdown(result))
    out = Path("bench/results")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"propagation-{int(time.time())}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
