"""Proxy diagnostics through the agent's tunnel, against the admin API called directly.

    uv run python -m bench.agent.bench [--requests 300] [--markers 30]

Starts the agent tests' fleet (``tests/agent/fleet.py``: mgmt-api on SQLite,
three Envoys from the wheel, ``meshplane-agent`` with static discovery, all
on loopback) and prints:

1. ``serverstats`` for one proxy through REST → mgmt-api → tunnel → agent →
   Envoy, against the same two admin calls (``/server_info`` and the
   filtered ``/stats``) made directly, interleaved one for one so both see
   the same machine; p50 and p99 of each (keep-alive clients);
2. the time to first byte of ``streamlogs``: a followed stream is open, the
   bench makes Envoy write a line (an admin request logged at debug), and
   measures until the line reaches the client; also from the moment the line
   is in the file (a watcher polls it every 0.5 ms), which is the agent's and
   mgmt-api's share (Envoy's own flush interval is 50 ms in the fleet);
3. how many concurrent diagnostics one agent serves: N clients calling
   ``serverstats`` in a loop for a few seconds (req/s and p99), and N log
   streams followed at once, each receiving a new line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.agent.fleet import Fleet
from tests.mgmt_api.harness import ADMIN_PASSWORD

FILTER = r"^server\.(live|uptime)$"
BODY = {"namespace": "shop", "workload": "web", "instance": "web-1", "filter": FILTER}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def latency(fleet: Fleet, requests: int) -> None:
    envoy = fleet.envoys["web-1"]
    tunnel: list[float] = []
    direct: list[float] = []
    with (
        httpx.Client(base_url=fleet.mgmt.url, auth=("admin", ADMIN_PASSWORD)) as rest,
        httpx.Client(base_url=envoy.admin_url) as admin,
    ):
        for _ in range(20):  # warm up both paths
            rest.post(fleet.path("serverstats"), json=BODY).raise_for_status()
            admin.get("/server_info")
        for _ in range(requests):
            start = time.perf_counter()
            rest.post(fleet.path("serverstats"), json=BODY).raise_for_status()
            tunnel.append(time.perf_counter() - start)
            start = time.perf_counter()
            admin.get("/server_info").raise_for_status()
            admin.get("/stats", params={"format": "json", "filter": FILTER}).raise_for_status()
            direct.append(time.perf_counter() - start)
    print(f"\n## serverstats, one proxy, {requests} sequential requests each")
    print("| path | p50 ms | p99 ms |\n|---|---|---|")
    print(f"| admin API direct (2 calls) | {pct(direct, 0.5):.2f} | {pct(direct, 0.99):.2f} |")
    print(f"| through the tunnel (REST) | {pct(tunnel, 0.5):.2f} | {pct(tunnel, 0.99):.2f} |")
    added = [t - d for t, d in zip(sorted(tunnel), sorted(direct), strict=True)]
    print(f"added by REST + tunnel + agent: p50 {statistics.median(added) * 1000:.2f} ms")


def ttfb(fleet: Fleet, markers: int) -> None:
    envoy = fleet.envoys["web-2"]
    assert envoy.log_path is not None
    envoy.admin("POST", "/logging?admin=debug")
    in_file: dict[str, float] = {}
    stop = threading.Event()

    def watch(path: Path) -> None:
        with path.open() as f:
            f.seek(0, 2)
            while not stop.is_set():
                line = f.readline()
                if not line:
                    time.sleep(0.0005)
                    continue
                if "bench-" in line:
                    key = line[line.index("bench-") :].split()[0].strip("'\"")
                    in_file.setdefault(key, time.perf_counter())

    watcher = threading.Thread(target=watch, args=(envoy.log_path,), daemon=True)
    watcher.start()
    from_trigger: list[float] = []
    from_file: list[float] = []
    body = {**BODY, "instance": "web-2", "follow": True, "tailLines": 0}
    del body["filter"]
    with (
        httpx.Client(base_url=fleet.mgmt.url, auth=("admin", ADMIN_PASSWORD), timeout=60) as c,
        c.stream("POST", fleet.path("streamlogs"), json=body) as stream,
    ):
        lines = stream.iter_lines()
        for _ in range(markers):
            marker = f"bench-{uuid.uuid4().hex}"
            start = time.perf_counter()
            envoy.admin("GET", f"/ready?{marker}")
            for raw in lines:
                if marker in json.loads(raw)["line"]:
                    arrived = time.perf_counter()
                    break
            from_trigger.append(arrived - start)
            if marker in in_file:
                from_file.append(arrived - in_file[marker])
            time.sleep(0.02)
    stop.set()
    envoy.admin("POST", "/logging?admin=info")
    print(f"\n## streamlogs time to first byte, {markers} lines")
    print("| from | p50 ms | p99 ms |\n|---|---|---|")
    print(
        f"| Envoy asked to log (incl. its 50 ms flush) | {pct(from_trigger, 0.5):.1f} | "
        f"{pct(from_trigger, 0.99):.1f} |"
    )
    if from_file:
        print(
            f"| line in the file ({len(from_file)} seen) | {pct(from_file, 0.5):.1f} | "
            f"{pct(from_file, 0.99):.1f} |"
        )


def concurrency(fleet: Fleet, seconds: float) -> None:
    print(f"\n## concurrent serverstats through one agent ({seconds:g} s each)")
    print("| clients | req/s | p50 ms | p99 ms | errors |\n|---|---|---|---|---|")
    for clients in (1, 4, 16, 48):
        samples: list[float] = []
        errors = [0]
        lock = threading.Lock()
        deadline = time.monotonic() + seconds

        def loop(
            deadline: float,
            samples: list[float],
            errors: list[int],
            lock: threading.Lock,
        ) -> None:
            with httpx.Client(
                base_url=fleet.mgmt.url, auth=("admin", ADMIN_PASSWORD), timeout=30
            ) as rest:
                while time.monotonic() < deadline:
                    start = time.perf_counter()
                    response = rest.post(fleet.path("serverstats"), json=BODY)
                    with lock:
                        if response.status_code == 200:
                            samples.append(time.perf_counter() - start)
                        else:
                            errors[0] += 1

        with ThreadPoolExecutor(clients) as pool:
            for _ in range(clients):
                pool.submit(loop, deadline, samples, errors, lock)
        print(
            f"| {clients} | {len(samples) / seconds:.0f} | {pct(samples, 0.5):.1f} | "
            f"{pct(samples, 0.99):.1f} | {errors[0]} |"
        )


def streams(fleet: Fleet, count: int) -> None:
    envoy = fleet.envoys["web-1"]
    envoy.admin("POST", "/logging?admin=debug")
    marker = f"bench-{uuid.uuid4().hex}"
    body = {"namespace": "shop", "workload": "web", "instance": "web-1", "follow": True}
    body["tailLines"] = 0
    opened = threading.Barrier(count + 1, timeout=120)
    got: list[float] = []
    lock = threading.Lock()

    def follow() -> None:
        with (
            httpx.Client(base_url=fleet.mgmt.url, auth=("admin", ADMIN_PASSWORD), timeout=120) as c,
            c.stream("POST", fleet.path("streamlogs"), json=body) as stream,
        ):
            opened.wait()
            for raw in stream.iter_lines():
                if marker in raw:
                    with lock:
                        got.append(time.perf_counter())
                    return

    threads = [threading.Thread(target=follow) for _ in range(count)]
    for t in threads:
        t.start()
    opened.wait()
    active = 'meshplane_agent_active_calls{operation="stream_logs"}'
    while fleet.agent.metric(active) < count:
        time.sleep(0.05)
    start = time.perf_counter()
    envoy.admin("GET", f"/ready?{marker}")
    for t in threads:
        t.join(120)
    envoy.admin("POST", "/logging?admin=info")
    print(f"\n## {count} log streams followed at once through one agent")
    print(
        f"{len(got)}/{count} received the new line; last after "
        f"{(max(got) - start) * 1000:.0f} ms (first {(min(got) - start) * 1000:.0f} ms)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--markers", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--streams", type=int, default=50)
    args = parser.parse_args()
    fleet = Fleet(Path(tempfile.mkdtemp(prefix="meshplane-bench-agent-")))
    try:
        latency(fleet, args.requests)
        ttfb(fleet, args.markers)
        concurrency(fleet, args.seconds)
        streams(fleet, args.streams)
    finally:
        fleet.close()


if __name__ == "__main__":
    main()
