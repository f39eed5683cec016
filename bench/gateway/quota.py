"""What a global limit costs a request through the gateway: quota (RLQS) against exact.

    uv run python bench/gateway/quota.py [--rounds 3] [--duration 3] [--clients 16]
                                         [--rate 1000] [--server envoy|h2]

One gateway Envoy (one worker thread), configured by what the compiler really
emits (:func:`mgmt_api.compiler.gateway_xds.compile_gateway`, RDS inlined into
a static bootstrap), in front of an upstream Envoy answering
``direct_response``, with the ``ratelimit`` service (``--server``, counting in
memory) serving both paths of a global limit. Six routes, alternated over
``--rounds`` rounds:

- ``/off``: no filter (the floor);
- ``/exact``: a global limit in ``mode: exact`` (one ShouldRateLimit call a request);
- ``/quota``: the same limit in ``mode: quota`` (Envoy's token bucket, a usage
  report every 5 s, no call a request);
- ``/jwt``: the path-claim ExtAuthzPolicy of ``bench/gateway/run.py``
  (HS256, path claim by prefix) with ``enforcement: local``: Envoy's
  ``jwt_authn`` and the Lua path-claim check
  (:mod:`mgmt_api.compiler.path_claim_lua`), no service call;
- ``/both``: that policy and the quota limit on the same route: a token
  checked and a global limit counted with no service call a request;
- ``/both-rules``: the quota limit and local JWT rules (``jwt_authn`` +
  ``rbac``, ES256) instead of the policy.

Every request carries a token its route admits (for ``/jwt`` and ``/both``,
a path claim of the route's own path). The policy's ext_authz server is an
address nothing listens on, so a request the Lua check refers to ext_authz is
denied; before measuring, one request a route must answer 200 and every
request of every run must be 2xx, or the bench stops. The limit (a million a
second) never denies. ``h2load --h1`` at a fixed offered rate; the figure is
the CPU per request of the whole path from ``/proc`` (gateway Envoy +
ratelimit, all its processes + the upstream Envoy), and the gateway's alone
beside it, each route's as a ratio to ``/off``'s. Prints each round and the
medians, with the load average (the machine may be shared).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import jwt  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from jwt.algorithms import ECAlgorithm  # noqa: E402

from bench.gateway.filters import _backend, _route, upstream_bootstrap  # noqa: E402
from bench.gateway.run import PATH_CLAIM_POLICY, SECRET  # noqa: E402
from bench.h2grpc import (  # noqa: E402
    cpu_seconds,
    h2load_summary,
    load_note,
    process_tree,
    require_h2load,
)
from extauthz.cli import mint_demo_token  # noqa: E402
from meshplane import gateway_contract as gc  # noqa: E402
from mgmt_api.compiler import envoy_config, gateway_xds, local_jwt  # noqa: E402
from mgmt_api.compiler.ratelimit import render_rls_files  # noqa: E402
from mgmt_api.compiler.traffic_policy import BackendTrafficPolicy  # noqa: E402
from tests.support.envoy import EnvoyProcess  # noqa: E402
from tests.support.net import free_port  # noqa: E402
from tests.support.processes import Service  # noqa: E402

GROUP = "organizations/o/tenants/t/workspaces/w/securitygroups/g"
ISSUER = "https://bench"
KEY = ec.generate_private_key(ec.SECP256R1())
PCLAIM_GROUP = "organizations/o/tenants/t/workspaces/w3/securitygroups/g3"
POLICY = "jwt"
PATHS = ("off", "exact", "quota", "jwt", "both", "both-rules")


def _policy(namespace: str, route: str, mode: str) -> tuple[str, BackendTrafficPolicy]:
    rule = {"limit": {"requests": 1_000_000, "unit": "Second"}, "mode": mode}
    doc = {
        "metadata": {"namespace": namespace, "name": f"{route}-limit"},
        "spec": {
            "targetRef": {"kind": "HTTPRoute", "name": route},
            "rateLimit": {"type": "Global", "global": {"rules": [rule]}},
        },
    }
    fqn = f"organizations/o/clusters/c1/backendtrafficpolicies/{namespace}.{route}-limit"
    return fqn, BackendTrafficPolicy.model_validate(doc)


def _local_setting() -> envoy_config.ExtAuthzRoute:
    public = ECAlgorithm.to_jwk(KEY.public_key(), as_dict=True)
    keys = {"jwks": {"value": json.dumps({"keys": [{**public, "kid": "k1"}]})}}
    local = {"rules": [{"from": [{"jwt": {"iss": ISSUER}}]}], "keys": keys}
    return envoy_config.ExtAuthzRoute(
        setting=f"{GROUP}/settings/local",
        group=GROUP,
        namespaces=("local",),
        uri="grpc://127.0.0.1:9191",
        policy=None,
        local=local,
    )


def _path_claim_setting(extauthz: int) -> envoy_config.ExtAuthzRoute:
    """Namespace ``pclaim`` under the path-claim policy; its server at ``extauthz``."""
    return envoy_config.ExtAuthzRoute(
        setting=f"{PCLAIM_GROUP}/settings/s",
        group=PCLAIM_GROUP,
        namespaces=("pclaim",),
        uri=f"grpc://127.0.0.1:{extauthz}",
        policy=POLICY,
    )


def rules_token() -> str:
    """An ES256 token the ``/both-rules`` route's local rule allows."""
    now = int(time.time())
    claims = {"iss": ISSUER, "sub": "bench", "exp": now + 3600}
    return jwt.encode(claims, KEY, algorithm="ES256", headers={"kid": "k1"})


def tokens() -> dict[str, str]:
    """route -> the bearer token its requests carry (each one its route admits)."""
    out = {path: mint_demo_token(SECRET, f"/{path}", 3600) for path in PATHS}
    out["both-rules"] = rules_token()
    return out


def compiled(
    port: int, upstream: int, ratelimit: int, extauthz: int
) -> tuple[Any, dict[str, bytes]]:
    """(the gateway's static bootstrap, the ratelimit config files)."""
    routes = [
        _route("default", "off", "/off"),
        _route("default", "exact", "/exact"),
        _route("default", "quota", "/quota"),
        _route("pclaim", "jwt", "/jwt"),
        _route("pclaim", "both", "/both"),
        _route("local", "both-rules", "/both-rules"),
    ]
    policies = (
        _policy("default", "exact", "exact"),
        _policy("default", "quota", "quota"),
        _policy("pclaim", "both", "quota"),
        _policy("local", "both-rules", "quota"),
    )
    inp_policies = envoy_config.EnvoyConfigInput(
        cluster_fqn="organizations/o/clusters/c1",
        cluster="c1",
        traffic_policies=policies,
        ext_authz=(_local_setting(), _path_claim_setting(extauthz)),
        extauthz_policies=((POLICY, PATH_CLAIM_POLICY),),
    )
    enforcement = envoy_config.policy_enforcements(inp_policies)[POLICY]
    if enforcement.path != local_jwt.ENFORCEMENT_LOCAL:
        raise SystemExit(f"the path-claim policy is not enforced locally: {enforcement.reason}")
    inp = gateway_xds.GatewayInput(inp_policies, tuple(routes), (_backend(upstream),))
    node = gc.GatewayNode(
        "o", "c1", "gw", "127.0.0.1", port, ratelimit_service=f"grpc://127.0.0.1:{ratelimit}"
    )
    resources = gateway_xds.compile_gateway(inp, node)
    listener = copy.deepcopy(resources.listeners[0])
    manager = listener["filterChains"][0]["filters"][0]["typedConfig"]
    del manager["rds"]
    manager["routeConfig"] = resources.route_configurations[0]
    bootstrap = {
        "admin": {"address": {"socketAddress": {"address": "127.0.0.1", "portValue": 0}}},
        "staticResources": {"listeners": [listener], "clusters": list(resources.clusters)},
    }
    return bootstrap, render_rls_files("c1", [policy for _, policy in policies])


def h2load(
    port: int, path: str, args: argparse.Namespace, bearer: str, pids: dict[str, list[int]]
) -> dict[str, float]:
    cmd = ["h2load", "--h1", "-c", str(args.clients), "-m", "1", "-t", "1",
           "-D", str(max(1, round(args.duration))), "-H", f"authorization: Bearer {bearer}",
           f"http://127.0.0.1:{port}/{path}"]  # fmt: skip
    if args.rate:
        cmd[1:1] = ["--rps", str(max(1, args.rate // args.clients))]
    before = {k: cpu_seconds(v) for k, v in pids.items()}
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    after = {k: cpu_seconds(v) for k, v in pids.items()}
    summary = h2load_summary(out)
    if summary.ok == 0 or summary.ok < summary.done:
        raise SystemExit(f"/{path}: {summary.ok} of {summary.done} requests 2xx:\n{out}")
    result = {"rps": summary.rps, "ok_ratio": summary.ok / max(1, summary.done)}
    for key in pids:
        result[key] = (after[key] - before[key]) * 1e6 / summary.ok
    result["path"] = sum(result[key] for key in pids)
    return result


def admitted(port: int, bearers: dict[str, str]) -> None:
    """One request a route with its token: each must answer 200, or the bench stops.

    A route that denies would measure a 403 (cheaper than the path), not the
    filters; the gateway's denial reason is printed with the status.
    """
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10.0) as client:
        for path in PATHS:
            answer = client.get(f"/{path}", headers={"authorization": f"Bearer {bearers[path]}"})
            if answer.status_code != 200:
                reasons = {
                    k: v for k, v in answer.headers.items() if "reason" in k or "denied" in k
                }
                raise SystemExit(
                    f"/{path} answered {answer.status_code}, not 200: {reasons} "
                    f"{answer.text[:300]!r}"
                )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per h2load run")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--rate", type=int, default=1000, help="offered req/s (0: saturation)")
    parser.add_argument("--server", choices=("envoy", "h2"), default="envoy")
    args = parser.parse_args()
    require_h2load()
    runs: dict[str, list[dict[str, float]]] = {path: [] for path in PATHS}
    bearers = tokens()
    started: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="bench-quota-") as tmp:
        try:
            up_port, gw_port, rl_port = free_port(), free_port(), free_port()
            # Nothing listens there: a request referred to ext_authz is denied.
            bootstrap, files = compiled(gw_port, up_port, rl_port, free_port())
            config = Path(tmp) / "ratelimit"
            config.mkdir()
            for name, content in files.items():
                (config / name).write_bytes(content)
            service = Service(
                ["ratelimit.cli", "serve", "--config", str(config), "--server", args.server,
                 "--listen", f"127.0.0.1:{rl_port}"],
                rl_port, Path(tmp) / "ratelimit.log",
            ).start()  # fmt: skip
            started.append(service)
            up = EnvoyProcess(upstream_bootstrap(up_port), Path(tmp) / "up").start()
            started.append(up)
            gateway = EnvoyProcess(bootstrap, Path(tmp) / "gw").start()
            started.append(gateway)
            assert service.proc is not None
            pids = {
                "gateway": process_tree(gateway.pid),
                "ratelimit": process_tree(service.proc.pid),
                "upstream": process_tree(up.pid),
            }
            admitted(gw_port, bearers)
            for path in PATHS:  # warm-up: quota buckets subscribed, connections open
                h2load(gw_port, path, argparse.Namespace(**{**vars(args), "duration": 1}),
                       bearers[path], pids)  # fmt: skip
            for index in range(args.rounds):
                for path in PATHS:
                    result = h2load(gw_port, path, args, bearers[path], pids)
                    runs[path].append(result)
                    print(
                        f"  round {index + 1} /{path:<10} {result['rps']:7.0f} req/s  "
                        f"path {result['path']:6.1f} µs/req  gateway {result['gateway']:6.1f}  "
                        f"ratelimit {result['ratelimit']:6.1f}  2xx {result['ok_ratio']:.3f}"
                    )
        finally:
            for process in reversed(started):
                process.stop()
    offered = f"{args.rate} req/s offered" if args.rate else "saturation"
    print(f"\n## Whole path, h2load --h1 -c {args.clients}, {offered}, "
          f"ratelimit --server {args.server} (in memory), medians of {args.rounds}\n")  # fmt: skip
    print(
        "| route | req/s | path CPU µs/req | vs /off | gateway µs/req | vs /off "
        "| ratelimit µs/req |"
    )
    print("|---|---|---|---|---|---|---|")
    base = statistics.median(r["path"] for r in runs["off"])
    base_gw = statistics.median(r["gateway"] for r in runs["off"])
    for path, samples in runs.items():
        cpu = statistics.median(r["path"] for r in samples)
        gw = statistics.median(r["gateway"] for r in samples)
        print(
            f"| /{path} | {statistics.median(r['rps'] for r in samples):.0f} | {cpu:.1f} | "
            f"{cpu / base:.2f}x | {gw:.1f} | {gw / base_gw:.2f}x | "
            f"{statistics.median(r['ratelimit'] for r in samples):.1f} |"
        )
    both = statistics.median(r["path"] for r in runs["both"])
    print(
        f"\n/both (path-claim policy + quota) ÷ /off, whole path: {both / base:.2f}x (target <= 2)"
    )
    print(f"\n{load_note()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
