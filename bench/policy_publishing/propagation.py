"""Policy propagation latency: from the 200 of a PUT to the first decision that reflects it.

    uv run python -m bench.policy_publishing.propagation [--subscribers 10] [--updates 200]

Starts ``mgmt-api serve`` (SQLite) and N real ``ratelimit serve`` processes
subscribed with ``--control-plane`` (each its own supervisor, subscriber and
worker, as in production), seeds the demo cluster with
:mod:`mgmt_api.demo.seed`, then does U updates of its BackendTrafficPolicy,
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
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from mgmt_api.demo.seed import DemoPlan, demo_plan, seed

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

    def __init__(self, work: Path) -> None:
        self.port, self.grpc_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "MESHPLANE_DATA_DIR": str(work)}
        env["MESHPLANE_ADMIN_PASSWORD"] = ADMIN_PASSWORD
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "mgmt_api.cli", "serve",
                "--listen", f"127.0.0.1:{self.port}",
                "--database", f"sqlite+pysqlite:///{work / 'mgmt-api.db'}",
                "--grpc-listen", f"127.0.0.1:{self.grpc_port}",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(work / "mgmt-api.log", "ab"),  # noqa: SIM115
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


async def measure(mgmt: Mgmt, plan: DemoPlan, ports: list[int], updates: int) -> list[list[float]]:
    request = rate_limit_request(plan)
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
    finally:
        for channel in channels:
            await channel.close()
    return samples


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run(subscribers: int, updates: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="meshplane-propagation-"))
    mgmt = Mgmt(work)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        plan = demo_plan(requests=FIRST_LIMIT, unit="Hour")
        credentials = work / "credentials.json"
        with mgmt.admin() as client:
            seed(client, plan, credentials)
        ports = []
        for index in range(subscribers):
            proc, port = start_subscriber(work, index, mgmt.grpc_port, credentials, plan)
            procs.append(proc)
            ports.append(port)
        for port in ports:
            wait_for_port(port, timeout=120)
        load_before = os.getloadavg()
        samples = asyncio.run(measure(mgmt, plan, ports, updates))
        load_after = os.getloadavg()
    finally:
        for proc in procs:
            stop(proc)
        stop(mgmt.proc)
    everything = [value for column in samples for value in column]
    return {
        "subscribers": subscribers,
        "updates": updates,
        "samples": len(everything),
        "all": summary(everything),
        "per_subscriber": [summary(column) for column in samples],
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
        "cpus": os.cpu_count(),
    }


def markdown(result: dict[str, Any]) -> str:
    overall = result["all"]
    lines = [
        f"{result['updates']} updates x {result['subscribers']} subscribers = "
        f"{result['samples']} samples; load average before/after "
        f"{result['loadavg_before'][0]} / {result['loadavg_after'][0]} on {result['cpus']} CPUs",
        "",
        "| | p50 | p99 | max |",
        "|---|---|---|---|",
        f"| all | {overall['p50_ms']} ms | {overall['p99_ms']} ms | {overall['max_ms']} ms |",
    ]
    for i, row in enumerate(result["per_subscriber"]):
        lines.append(
            f"| subscriber {i} | {row['p50_ms']} ms | {row['p99_ms']} ms | {row['max_ms']} ms |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--subscribers", type=int, default=10)
    parser.add_argument("--updates", type=int, default=200)
    args = parser.parse_args()
    result = run(args.subscribers, args.updates)
    print(markdown(result))
    out = Path("bench/results")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"propagation-{int(time.time())}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
