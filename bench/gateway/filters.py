"""What the gateway listener's pass-through filters and path normalization cost a request.

    uv run python bench/gateway/filters.py [--rounds 5] [--duration 3] [--clients 32] [--rate 3000]

Issue 24's before/after run of ``bench/gateway/run.py`` showed the whole
gateway path 17 % dearer on a route with no filter, after every gateway
listener gained the local-JWT ``jwt_authn`` + ``rbac`` filters (pass-through on
routes without local rules) and HCM path normalization. This bench separates
the two, on the gateway Envoy alone, with the configuration the compiler
really emits (:func:`mgmt_api.compiler.gateway_xds.compile_gateway`, RDS
inlined into a static bootstrap):

- ``bare``: the listener of a cluster without local rules, with the three
  path-normalization settings removed (the state before issue 24);
- ``normalized``: that listener as compiled;
- ``pass-through``: the listener of a cluster with local rules and a route
  under them, its ``jwt_authn`` + ``rbac`` enabled for every request as they
  were first compiled; requests go to ``/off``, which they pass through;
- ``disabled``: the same, as compiled now: the two filters disabled on the
  listener and enabled only by the routes under local rules.

Each is its own Envoy (one worker thread), all in front of one upstream Envoy
answering ``direct_response``. ``h2load --h1`` with ``--clients`` connections
runs against each in turn at a fixed offered rate (``--rate``), alternated
over ``--rounds`` rounds; the figure is
the gateway Envoy's CPU per request from ``/proc`` (user + system), which a
shared machine disturbs less than req/s. Prints each round and the medians.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from jwt.algorithms import ECAlgorithm  # noqa: E402

from bench.h2grpc import (  # noqa: E402
    cpu_seconds,
    h2load_summary,
    load_note,
    process_tree,
    require_h2load,
)
from meshplane import gateway_contract as gc  # noqa: E402
from mgmt_api.compiler import envoy_config, gateway_xds  # noqa: E402
from mgmt_api.compiler.http_route import Backend, HTTPRoute  # noqa: E402
from tests.support.envoy import EnvoyProcess  # noqa: E402
from tests.support.net import free_port  # noqa: E402

GROUP = "organizations/o/tenants/t/workspaces/w/securitygroups/g"
NORMALIZATION = ("normalizePath", "mergeSlashes", "pathWithEscapedSlashesAction")


def _route(namespace: str, name: str, prefix: str) -> tuple[str, HTTPRoute]:
    ref = {
        "group": "gateway.envoyproxy.io",
        "kind": "Backend",
        "name": "app",
        "namespace": "default",
    }
    rule = {"matches": [{"path": {"type": "PathPrefix", "value": prefix}}], "backendRefs": [ref]}
    doc = {"metadata": {"namespace": namespace, "name": name}, "spec": {"rules": [rule]}}
    return f"organizations/o/clusters/c1/httproutes/{namespace}.{name}", HTTPRoute.model_validate(
        doc
    )


def _backend(port: int) -> tuple[str, Backend]:
    doc = {
        "metadata": {"namespace": "default", "name": "app"},
        "spec": {"endpoints": [{"ip": {"address": "127.0.0.1", "port": port}}]},
    }
    return "organizations/o/clusters/c1/backends/default.app", Backend.model_validate(doc)


def _local_setting() -> envoy_config.ExtAuthzRoute:
    public = ECAlgorithm.to_jwk(ec.generate_private_key(ec.SECP256R1()).public_key(), as_dict=True)
    keys = {"jwks": {"value": json.dumps({"keys": [{**public, "kid": "k1"}]})}}
    local = {"rules": [{"from": [{"jwt": {"iss": "https://bench"}}]}], "keys": keys}
    return envoy_config.ExtAuthzRoute(
        setting=f"{GROUP}/settings/local",
        group=GROUP,
        namespaces=("local",),
        uri="grpc://127.0.0.1:9191",
        policy=None,
        local=local,
    )


def gateway_bootstrap(
    port: int, upstream: int, *, local: bool, normalize: bool, enabled: bool
) -> Any:
    """The compiled gateway's listener, routes and clusters as one static bootstrap.

    ``local``: the cluster has a local-rules setting and a route under it;
    ``enabled``: the listener's local-JWT filters have their ``disabled`` flag
    removed, i.e. they run on every request (pass-through on ``/off``).
    """
    routes = [_route("default", "off", "/off")]
    if local:
        routes.append(_route("local", "local", "/local"))
    policies = envoy_config.EnvoyConfigInput(
        cluster_fqn="organizations/o/clusters/c1",
        cluster="c1",
        traffic_policies=(),
        ext_authz=(_local_setting(),) if local else (),
    )
    inp = gateway_xds.GatewayInput(policies, tuple(routes), (_backend(upstream),))
    resources = gateway_xds.compile_gateway(inp, gc.GatewayNode("o", "c1", "gw", "127.0.0.1", port))
    listener = copy.deepcopy(resources.listeners[0])
    manager = listener["filterChains"][0]["filters"][0]["typedConfig"]
    del manager["rds"]
    manager["routeConfig"] = resources.route_configurations[0]
    if not normalize:
        for key in NORMALIZATION:
            manager.pop(key)
    if enabled:
        for f in manager["httpFilters"]:
            f.pop("disabled", None)
    filters = [
        f["name"] + (" (disabled)" if f.get("disabled") else "") for f in manager["httpFilters"]
    ]
    print(f"  port {port}: local {local}, normalize {normalize}, filters {filters}")
    return {
        "admin": {"address": {"socketAddress": {"address": "127.0.0.1", "portValue": 0}}},
        "staticResources": {"listeners": [listener], "clusters": list(resources.clusters)},
    }


def upstream_bootstrap(port: int) -> Any:
    router = {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
    manager = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network."
        "http_connection_manager.v3.HttpConnectionManager",
        "statPrefix": "upstream",
        "routeConfig": {
            "virtualHosts": [
                {
                    "name": "all",
                    "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "directResponse": {"status": 200}}],
                }
            ]
        },
        "httpFilters": [{"name": "envoy.filters.http.router", "typedConfig": router}],
    }
    chain = {"filters": [{"name": gateway_xds.HCM_FILTER, "typedConfig": manager}]}
    address = {"socketAddress": {"address": "127.0.0.1", "portValue": port}}
    return {
        "admin": {"address": {"socketAddress": {"address": "127.0.0.1", "portValue": 0}}},
        "staticResources": {
            "listeners": [{"name": "up", "address": address, "filterChains": [chain]}]
        },
    }


def h2load(
    port: int, clients: int, duration: float, pids: list[int], rate: int = 0
) -> tuple[float, float]:
    """(req/s, gateway CPU µs per request) of one run against ``/off``; ``rate`` 0: flat out."""
    cmd = ["h2load", "--h1", "-c", str(clients), "-m", "1", "-t", "1",
           "-D", str(max(1, round(duration))), f"http://127.0.0.1:{port}/off"]  # fmt: skip
    if rate:
        cmd[1:1] = ["--rps", str(max(1, rate // clients))]
    before = cpu_seconds(pids)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    after = cpu_seconds(pids)
    summary = h2load_summary(out)
    if summary.ok == 0:
        raise SystemExit(f"no 2xx from the gateway on {port}:\n{out}")
    return summary.rps, (after - before) * 1e6 / summary.ok


VARIANTS = {
    "bare": {"local": False, "normalize": False, "enabled": False},
    "normalized": {"local": False, "normalize": True, "enabled": False},
    "pass-through": {"local": True, "normalize": True, "enabled": True},
    "disabled": {"local": True, "normalize": True, "enabled": False},
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per h2load run")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument(
        "--rate",
        type=int,
        default=3000,
        help="offered req/s in total (0: saturation); a fixed rate gives every listener "
        "the same batching, which saturation on a shared machine does not",
    )
    args = parser.parse_args()
    require_h2load()
    started = []
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="bench-filters-") as tmp:
        try:
            up_port = free_port()
            up = EnvoyProcess(upstream_bootstrap(up_port), Path(tmp) / "up").start()
            started.append(up)
            gateways = {}
            for name, variant in VARIANTS.items():
                port = free_port()
                config = gateway_bootstrap(port, up_port, **variant)
                envoy = EnvoyProcess(config, Path(tmp) / name).start()
                started.append(envoy)
                gateways[name] = (port, process_tree(envoy.pid))
            for port, _ in gateways.values():  # warm-up
                h2load(port, args.clients, 1, [])
            for index in range(args.rounds):
                for name, (port, pids) in gateways.items():
                    rps, cpu = h2load(port, args.clients, args.duration, pids, args.rate)
                    runs[name].append((rps, cpu))
                    print(f"  round {index + 1} {name:<13} {rps:8.0f} req/s  {cpu:6.1f} µs/req")
        finally:
            for envoy in started:
                envoy.stop()
    offered = f"{args.rate} req/s offered" if args.rate else "saturation"
    print(f"\n## Gateway Envoy alone, h2load --h1 -c {args.clients}, {offered}, /off, medians\n")
    print("| listener | req/s | gateway CPU µs/req | vs bare | CPU of each round |")
    print("|---|---|---|---|---|")
    base = statistics.median(cpu for _, cpu in runs["bare"])
    for name, samples in runs.items():
        cpu = statistics.median(c for _, c in samples)
        rps = statistics.median(r for r, _ in samples)
        each = ", ".join(f"{c:.1f}" for _, c in samples)
        print(f"| {name} | {rps:.0f} | {cpu:.1f} | {cpu / base:.2f} | {each} |")
    print(f"\n{load_note()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
