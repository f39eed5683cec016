"""The compose stack's one-shot seed step: the demo, written through mgmt-api's REST API.

It is :mod:`demo.seed` (the seeder behind ``scripts/run``) with the
compose network's addresses: the SecuritySetting points Envoy at the
``extauthz`` service, the cluster's counter store is the ``redis`` service,
and each component's key lands in ``--credentials-dir``
(``{component}-credentials.json``, where ``ratelimit`` and ``extauthz`` each
read their own ``--credentials``); the demo Backend is the ``upstream``
service. With ``--gateway-template`` it also writes the gateway's bootstrap:
``envoy.yaml`` beside this file with its :data:`TOKEN_PLACEHOLDER` replaced
by a token signed with the gateway's key for the xDS audience, mode 0600
(a token is a secret; the template in the repository holds none).
Idempotent, so ``docker compose up`` may run it on every start, which also
renews the gateway's token.

    python seed.py --url http://mgmt-api:8080 --credentials-dir /credentials \
        --gateway-template /seed/envoy.yaml --gateway-bootstrap /gateway/envoy.yaml
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import httpx

from demo.seed import DemoPlan, SeedError, credential_files, demo_plan, seed
from meshplane import control_plane, gateway_contract
from meshplane.config_error import ConfigError
from meshplane.secret_file import write_secret

EXTAUTHZ_URI = "grpc://extauthz:9191"
REDIS_URL = "redis://redis:6379/0"
UPSTREAM = "upstream:8000"
TOKEN_PLACEHOLDER = "MESHPLANE_GATEWAY_TOKEN"  # noqa: S105 - the name of a placeholder


def write_gateway_bootstrap(template: Path, credentials: Path, out: Path) -> None:
    """The template with a fresh gateway token in place of the placeholder, mode 0600."""
    text, slot = template.read_text(), f"Bearer {TOKEN_PLACEHOLDER}"
    if text.count(slot) != 1:
        raise SeedError(f"{template} must hold {slot!r} exactly once")
    token = control_plane.load_credentials(credentials).token(
        ttl=gateway_contract.GATEWAY_TOKEN_TTL_SECONDS, audience=gateway_contract.XDS_AUDIENCE
    )
    write_secret(out, text.replace(slot, f"Bearer {token}"))


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
    parser.add_argument(
        "--credentials-dir", required=True, help="where to write each component's key"
    )
    parser.add_argument("--extauthz-uri", default=EXTAUTHZ_URI, help="ext_authz Envoy calls")
    parser.add_argument("--redis-url", default=REDIS_URL, help="the cluster's counter store")
    parser.add_argument("--upstream", default=UPSTREAM, help="the demo Backend's HOST:PORT")
    parser.add_argument("--gateway-template", help="the gateway bootstrap with the placeholder")
    parser.add_argument("--gateway-bootstrap", help="where to write it with a token (0600)")
    parser.add_argument("--wait-seconds", type=float, default=120.0)
    return parser


def plan_for(args: argparse.Namespace) -> DemoPlan:
    host, _, port = args.upstream.rpartition(":")
    return demo_plan(
        extauthz_uri=args.extauthz_uri,
        cluster_rate_limit={"backend": {"type": "Redis", "redis": {"url": args.redis_url}}},
        upstream={"fqdn": {"hostname": host, "port": int(port)}},
    )


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if bool(args.gateway_template) != bool(args.gateway_bootstrap):
        print(
            "seed: error: --gateway-template and --gateway-bootstrap go together", file=sys.stderr
        )
        return 2
    password = os.environ.get("MESHPLANE_ADMIN_PASSWORD")
    if not password:
        print("seed: error: set MESHPLANE_ADMIN_PASSWORD", file=sys.stderr)
        return 2
    plan = plan_for(args)
    with httpx.Client(base_url=args.url, auth=("admin", password), timeout=10) as client:
        try:
            _wait_ready(client, args.wait_seconds)
            keys = credential_files(Path(args.credentials_dir))
            report = seed(client, plan, keys)
            if args.gateway_template:
                write_gateway_bootstrap(
                    Path(args.gateway_template),
                    keys["gateway"],
                    Path(args.gateway_bootstrap),
                )
        except (SeedError, ConfigError, OSError) as exc:
            print(f"seed: error: {exc}", file=sys.stderr)
            return 1
    for path, action in report.items():
        print(f"{action:9} {path}")
    print(f"cluster {plan.organization}/{plan.cluster}; ext_authz policy {plan.extauthz_policy}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
