"""Management API benchmark: latency at a fixed offered rate, list throughput, big delete.

    uv run python -m bench.mgmt_api.bench [--backend sqlite|postgresql|both] [--duration 15]

For each store it starts ``mgmt-api serve`` as a subprocess (PostgreSQL: a
throwaway server from tests/support/postgres.py) and measures, with 8
concurrent clients:

* GET and PUT of a cluster at a fixed offered rate (default 200 req/s in
  total, open loop: each client sends on a schedule, and latency is measured
  from the scheduled send time so a stall is not hidden);
* list throughput over 10,000 clusters read in pages of 100;
* the time of one DELETE of an organization holding 50,000 objects.

Large trees are seeded straight into the store with the store's own table
definitions (creating 60,000 objects through HTTP would measure the create
path, not the one under test). Results print as a markdown table and are
written as JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from mgmt_api.store import repo, tables
from mgmt_api.store.engine import create_engine, write_tx
from tests.mgmt_api.harness import MgmtServer
from tests.support.postgres import PostgresServer, find_bin_dir

CLIENTS = 8


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))
    return ordered[index]


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process (Linux /proc), to report CPU per request.

    On a shared, noisy machine CPU-µs per request is much steadier than
    latency, which also measures everyone else's load.
    """
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def fixed_rate(
    url: str, token: str, rate: float, duration: float, make_request: Any, pid: int
) -> dict[str, Any]:
    """Open-loop load: CLIENTS threads, each sending rate/CLIENTS req/s on a schedule."""
    per_client = rate / CLIENTS
    latencies: list[list[float]] = [[] for _ in range(CLIENTS)]
    errors = [0] * CLIENTS
    start = time.perf_counter() + 0.5

    def client(i: int) -> None:
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        ) as c:
            state: dict[str, Any] = {}
            n = 0
            while True:
                scheduled = start + (n + i / CLIENTS) / per_client
                if scheduled - start > duration:
                    return
                delay = scheduled - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                response = make_request(c, i, state)
                latencies[i].append(time.perf_counter() - scheduled)
                if response.status_code != 200:
                    errors[i] += 1
                n += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    cpu0 = cpu_seconds(pid)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cpu = cpu_seconds(pid) - cpu0
    flat = [v * 1000 for lst in latencies for v in lst]
    return {
        "server_cpu_us_per_request": round(cpu / max(1, len(flat)) * 1e6),
        "offered_rps": rate,
        "requests": len(flat),
        "errors": sum(errors),
        "p50_ms": round(percentile(flat, 50), 2),
        "p99_ms": round(percentile(flat, 99), 2),
        "max_ms": round(max(flat), 2),
        "mean_ms": round(statistics.fmean(flat), 2),
    }


def seed(database_url: str, parent: str, rows: list[tuple[str, str, str]]) -> None:
    """Bulk-insert objects (and their policies, as the API would create) under ``parent``."""
    engine = create_engine(database_url)
    try:
        now = repo.now_us()
        with write_tx(engine) as conn:
            for i in range(0, len(rows), 5000):
                chunk = rows[i : i + 5000]
                conn.execute(
                    sa.insert(tables.resources),
                    [
                        {
                            "fqn": f,
                            "parent": p,
                            "kind": k,
                            "name": f.rsplit("/", 1)[1],
                            "spec": '{"tokenTtl":"3600s","tier1Cluster":false}'
                            if k == "Cluster"
                            else "{}",
                            "status": "{}",
                            "etag": '"seed"',
                            "protected": False,
                            "creator": "bench",
                            "create_time": now,
                            "update_time": now,
                        }
                        for f, p, k in chunk
                    ],
                )
                conn.execute(
                    sa.insert(tables.policies),
                    [
                        {
                            "fqn": f,
                            "allow": "[]",
                            "description": "",
                            "etag": '"seed"',
                            "update_time": now,
                        }
                        for f, _, _ in chunk
                    ],
                )
    finally:
        engine.dispose()


def run_backend(
    backend: str, duration: float, rate: float, pg: PostgresServer | None
) -> dict[str, Any]:
    database = pg.new_database() if pg else None
    server = MgmtServer(database).start()
    results: dict[str, Any] = {"backend": backend}
    try:
        with server.admin() as admin:
            token = admin.post("/v2/auth/token").json()["accessToken"]
            admin.post(
                "/v2/organizations", json={"name": "bench", "organization": {}}
            ).raise_for_status()
            for i in range(CLIENTS + 1):
                admin.post(
                    "/v2/organizations/bench/clusters", json={"name": f"c{i}", "cluster": {}}
                ).raise_for_status()

        def get(c: httpx.Client, i: int, state: dict[str, Any]) -> httpx.Response:
            return c.get("/v2/organizations/bench/clusters/c0")

        def put(c: httpx.Client, i: int, state: dict[str, Any]) -> httpx.Response:
            path = f"/v2/organizations/bench/clusters/c{i + 1}"
            if "etag" not in state:
                state["etag"] = c.get(path).json()["etag"]
            r = c.put(path, json={"etag": state["etag"], "network": f"n{time.time_ns()}"})
            if r.status_code == 200:
                state["etag"] = r.json()["etag"]
            return r

        assert server.proc is not None
        pid = server.proc.pid
        fixed_rate(server.url, token, rate, 2.0, get, pid)  # warm-up
        results["get"] = fixed_rate(server.url, token, rate, duration, get, pid)
        results["put"] = fixed_rate(server.url, token, rate, duration, put, pid)

        # list throughput over 10,000 clusters, pages of 100
        seed(
            server.database_url,
            "organizations/bench",
            [
                (f"organizations/bench/clusters/l{i:05d}", "organizations/bench", "Cluster")
                for i in range(10_000)
            ],
        )
        pages = [0] * CLIENTS
        items = [0] * CLIENTS

        def lister(i: int) -> None:
            with httpx.Client(
                base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=60
            ) as c:
                page_token = ""
                while True:
                    body = c.get(
                        "/v2/organizations/bench/clusters",
                        params={"pageSize": 100, "pageToken": page_token},
                    ).json()
                    pages[i] += 1
                    items[i] += len(body["clusters"])
                    page_token = body["nextPageToken"]
                    if not page_token:
                        return

        t0 = time.perf_counter()
        threads = [threading.Thread(target=lister, args=(i,)) for i in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - t0
        results["list"] = {
            "clusters": 10_000 + CLIENTS + 1,
            "full_listings": CLIENTS,
            "pages": sum(pages),
            "seconds": round(elapsed, 2),
            "pages_per_s": round(sum(pages) / elapsed, 1),
            "objects_per_s": round(sum(items) / elapsed),
        }

        # recursive delete of an organization holding 50,000 objects
        org = "organizations/big"
        rows: list[tuple[str, str, str]] = [(org, "", "Organization")]
        for t in range(125):  # 125 x (1 + 100 x (1 + 3)) > 50,000; cut to 50,000 below
            tenant = f"{org}/tenants/t{t}"
            rows.append((tenant, org, "Tenant"))
            for w in range(100):
                ws = f"{tenant}/workspaces/w{w}"
                rows.append((ws, tenant, "Workspace"))
                for g in range(3):
                    rows.append((f"{ws}/securitygroups/g{g}", ws, "SecurityGroup"))
        rows = rows[:50_000]
        seed(server.database_url, "", rows)
        with server.admin() as admin:
            t0 = time.perf_counter()
            r = admin.delete("/v2/organizations/big", timeout=300)
            elapsed = time.perf_counter() - t0
            r.raise_for_status()
        engine = create_engine(server.database_url)
        try:
            with engine.connect() as conn:
                left = conn.execute(
                    sa.select(sa.func.count())
                    .select_from(tables.resources)
                    .where(tables.resources.c.fqn.like("organizations/big%"))
                ).scalar_one()
                props = conn.execute(
                    sa.select(tables.audit_log.c.properties).where(
                        tables.audit_log.c.fqn == org, tables.audit_log.c.operation == "DELETE"
                    )
                ).scalar_one()
        finally:
            engine.dispose()
        assert left == 0, f"{left} objects left after the delete"
        results["delete"] = {
            "objects": len(rows),
            "deleted": json.loads(props)["deleted"],
            "seconds": round(elapsed, 2),
        }
    finally:
        server.close()
    return results


def markdown(all_results: list[dict[str, Any]], rate: float, duration: float) -> str:
    lines = [
        f"8 clients, open loop at {rate:g} req/s offered for {duration:g}s per phase.",
        "",
        "| store | GET p50 | GET p99 | GET CPU/req | PUT p50 | PUT p99 | PUT CPU/req | errors "
        "| list (10k clusters, pages of 100) | delete 50k objects |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in all_results:
        lines.append(
            f"| {r['backend']} | {r['get']['p50_ms']} ms | {r['get']['p99_ms']} ms | "
            f"{r['get']['server_cpu_us_per_request']} µs | "
            f"{r['put']['p50_ms']} ms | {r['put']['p99_ms']} ms | "
            f"{r['put']['server_cpu_us_per_request']} µs | "
            f"{r['get']['errors'] + r['put']['errors']} | "
            f"{r['list']['pages_per_s']} pages/s ({r['list']['objects_per_s']} objects/s) | "
            f"{r['delete']['seconds']} s |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--rate", type=float, default=200.0)
    args = parser.parse_args()
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    pg: PostgresServer | None = None
    all_results = []
    try:
        for backend in backends:
            if backend == "postgresql" and pg is None:
                bin_dir = find_bin_dir()
                if bin_dir is None:
                    raise SystemExit("no PostgreSQL binaries found")
                pg = PostgresServer(bin_dir).start()
            result = run_backend(
                backend, args.duration, args.rate, pg if backend == "postgresql" else None
            )
            print(json.dumps(result), flush=True)
            all_results.append(result)
    finally:
        if pg is not None:
            pg.stop()
    out = Path("bench/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"mgmt_api-{int(time.time())}.json").write_text(json.dumps(all_results, indent=2))
    load = os.getloadavg()
    print(markdown(all_results, args.rate, args.duration))
    print(
        f"\nload average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
        f"on {os.cpu_count()} CPUs"
    )


if __name__ == "__main__":
    main()
