"""First-render times of the console's pages, on the server and in Chromium.

    uv run python -m bench.console.render [--clusters 5000] [--runs 20]

Starts a real ``mgmt-api serve`` (SQLite, policy stream on), seeds the demo
organization with ``--clusters`` clusters (one bulk of REST POSTs) and a
rate limit, signs in through the console, then for each page:

* server: wall time of ``GET /ui/...`` with the session cookie (what the
  console's handler costs, its in-process ``/v2`` calls included), from a
  loopback client, ``--runs`` times; prints min / median / p95;
* browser: headless Debian Chromium, navigation start to the ``load``
  event (``performance.getEntriesByType('navigation')``), ``--runs`` times.

Noise: a shared 2-core machine; read the medians, and compare runs made
back to back.
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from playwright.sync_api import sync_playwright

from tests.console.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.mgmt_api.harness import ADMIN_PASSWORD, MgmtServer

ORG = "bench"


def seed(server: MgmtServer, clusters: int) -> None:
    with server.admin() as admin:
        admin.post("/v2/organizations", json={"name": ORG, "organization": {}}).raise_for_status()

        def create(i: int) -> None:
            with server.admin() as client:
                client.post(
                    f"/v2/organizations/{ORG}/clusters",
                    json={"name": f"cluster-{i:05d}", "cluster": {"network": f"net-{i % 7}"}},
                ).raise_for_status()

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(create, range(clusters)))
        body = {
            "name": "default.web-limit",
            "backendTrafficPolicy": {
                "spec": {
                    "targetRef": {"kind": "HTTPRoute", "name": "web"},
                    "rateLimit": {
                        "type": "Global",
                        "global": {"rules": [{"limit": {"requests": 3, "unit": "Minute"}}]},
                    },
                }
            },
        }
        admin.post(
            f"/v2/organizations/{ORG}/clusters/cluster-00000/backendtrafficpolicies", json=body
        ).raise_for_status()


def pages(clusters: int) -> dict[str, str]:
    c = f"/ui/o/{ORG}/c/cluster-00000"
    return {
        "organizations": "/ui/",
        f"organization ({clusters} clusters, first page)": f"/ui/o/{ORG}",
        "cluster search": f"/ui/o/{ORG}?q=cluster-0421",
        "cluster": c,
        "rate limit": c + "/traffic/default.web-limit",
        "approvals": f"/ui/o/{ORG}/approvals",
        "audit log": f"/ui/o/{ORG}/audit",
        "dashboards": "/ui/dashboards",
    }


def summary(samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return (
        f"min {ordered[0] * 1000:6.1f}  median {statistics.median(ordered) * 1000:6.1f}  "
        f"p95 {p95 * 1000:6.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clusters", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    server = MgmtServer().start()
    try:
        started = time.perf_counter()
        seed(server, args.clusters)
        print(f"seeded {args.clusters} clusters in {time.perf_counter() - started:.0f} s")
        token = (
            httpx.post(server.url + "/v2/auth/token", auth=("admin", ADMIN_PASSWORD), timeout=30)
            .raise_for_status()
            .json()["accessToken"]
        )
        cookies = {"meshplane-console": token}
        print("server time (GET /ui/..., loopback client):")
        with httpx.Client(base_url=server.url, cookies=cookies, timeout=30) as client:
            for label, path in pages(args.clusters).items():
                samples = []
                for _ in range(args.runs + 2):
                    t0 = time.perf_counter()
                    response = client.get(path)
                    samples.append(time.perf_counter() - t0)
                    assert response.status_code == 200, (path, response.status_code)
                print(f"  {label:42s} {summary(samples[2:])}")
        print("browser (Chromium, navigation start to load event):")
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                context = browser.new_context()
                context.add_cookies(
                    [{"name": "meshplane-console", "value": token, "url": server.url + "/ui/"}]
                )
                page = context.new_page()
                for label, path in pages(args.clusters).items():
                    samples = []
                    for _ in range(args.runs + 1):
                        page.goto(server.url + path, wait_until="load")
                        samples.append(
                            page.evaluate(
                                "() => { const n = performance.getEntriesByType('navigation')[0];"
                                " return n.loadEventEnd > 0 ? n.loadEventEnd : n.duration; }"
                            )
                            / 1000
                        )
                    print(f"  {label:42s} {summary(samples[1:])}")
            finally:
                browser.close()
    finally:
        server.close()


if __name__ == "__main__":
    main()
