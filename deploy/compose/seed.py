"""The compose stack's one-shot seed step: the demo, written through mgmt-api's REST API.

It is :mod:`mgmt_api.demo.seed` (the seeder behind ``scripts/run``) with the
compose network's addresses: the SecuritySetting points Envoy at the
``extauthz`` service, the cluster's counter store is the ``redis`` service,
and the cluster's service-account key lands where ``ratelimit`` and
``extauthz`` read their ``--credentials``. Idempotent, so ``docker compose
up`` may run it on every start.

    python seed.py --url http://mgmt-api:8080 --credentials /credentials/demo.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import httpx

from mgmt_api.demo.seed import DemoPlan, SeedError, demo_plan, seed

EXTAUTHZ_URI = "grpc://extauthz:9191"
REDIS_URL = "redis://redis:6379/0"


def _wait_ready(client: httpx.Client, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            if client.get("/readyz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise SeedError(f"mgmt-api at {client.base_url} was not ready within {seconds:g}s")
        time.sleep(0.5)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="seed", description="seed the compose demo")
    parser.add_argument("--url", required=True, help="mgmt-api base URL")
    parser.add_argument("--credentials", required=True, help="where to write the cluster key")
    parser.add_argument("--extauthz-uri", default=EXTAUTHZ_URI, help="ext_authz Envoy calls")
    parser.add_argument("--redis-url", default=REDIS_URL, help="the cluster's counter store")
    parser.add_argument("--wait-seconds", type=float, default=120.0)
    return parser


def plan_for(args: argparse.Namespace) -> DemoPlan:
    return demo_plan(
        extauthz_uri=args.extauthz_uri,
        cluster_rate_limit={"backend": {"type": "Redis", "redis": {"url": args.redis_url}}},
    )


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    password = os.environ.get("MESHPLANE_ADMIN_PASSWORD")
    if not password:
        print("seed: error: set MESHPLANE_ADMIN_PASSWORD", file=sys.stderr)
        return 2
    plan = plan_for(args)
    with httpx.Client(base_url=args.url, auth=("admin", password), timeout=10) as client:
        try:
            _wait_ready(client, args.wait_seconds)
            report = seed(client, plan, Path(args.credentials))
        except SeedError as exc:
            print(f"seed: error: {exc}", file=sys.stderr)
            return 1
    for path, action in report.items():
        print(f"{action:9} {path}")
    print(f"cluster {plan.organization}/{plan.cluster}; ext_authz policy {plan.extauthz_policy}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
