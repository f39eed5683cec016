"""The mesh hop: what a call through two sidecars costs, with mTLS and RBAC, against plain Envoys.

    uv run python bench/mesh/run.py [--rounds 4] [--duration 3] [--connections 8]

Starts the mesh stack of ``tests/support/mesh.py`` (mgmt-api, the services,
and sidecar Envoys configured over ADS) with two workloads ``client`` and
``server`` in namespace ``ns1``, whose security setting is mode NAMESPACE
(so the server's inbound listener runs Envoy's RBAC on the caller's SPIFFE
principal, after the mTLS handshake with certificates from the mesh CA).
The server's app is the stack's upstream Envoy (``direct_response``), so the
app's own cost is small, native and the same in every variant.

Three variants, alternated over rounds, ``h2load --h1`` with N connections
(one request in flight each, as an app's connection pool would):

- ``direct``: h2load → the app;
- ``plain``: h2load → Envoy A (HTTP, routes to B) → Envoy B (HTTP, routes to
  the app): the same Envoy binary, one worker each, static config, no TLS, no
  RBAC: "a plain Envoy hop";
- ``mesh``: h2load → the client's sidecar (outbound, by service name) →
  mTLS → the server's sidecar (inbound: RBAC, then the app).

CPU per request from /proc, per process (the two proxies apart, and the app).
The issue's target (24): a sidecar hop with mTLS costs at most 1.5x a plain
Envoy hop; compare ``mesh`` proxies' CPU per request with ``plain``'s.
Connections are kept open (h2load's keep-alive), so the handshake cost is
paid once per connection, as in a mesh with connection reuse.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench.h2grpc import cpu_seconds, h2load_summary, load_note, require_h2load  # noqa: E402
from tests.support.envoy import EnvoyProcess  # noqa: E402
from tests.support.mesh import MeshStack, Workload  # noqa: E402
from tests.support.net import free_port  # noqa: E402

_TYPE = "type.googleapis.com/"
_HCM = _TYPE + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_ROUTER = _TYPE + "envoy.extensions.filters.http.router.v3.Router"


def plain_proxy(listen: int, upstream: int, admin: int) -> dict[str, Any]:
    """A plain HTTP hop: one listener, every path to one static upstream, no TLS."""
    address = {"socket_address": {"address": "127.0.0.1", "port_value": upstream}}
    manager = {
        "@type": _HCM,
        "stat_prefix": "hop",
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "all",
                    "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "next"}}],
                }
            ]
        },
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": _ROUTER}}],
    }
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "hop",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen}},
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": manager,
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": [
                {
                    "name": "next",
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "load_assignment": {
                        "cluster_name": "next",
                        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address}}]}],
                    },
                }
            ],
        },
    }


@dataclasses.dataclass
class Variant:
    name: str
    url: str
    host: str
    proxies: list[int]  # pids of the proxies on the path (CPU counted as "proxies")


def h2load(variant: Variant, app_pid: int, connections: int, duration: float) -> dict[str, float]:
    cmd = ["h2load", "--h1", "-c", str(connections), "-m", "1", "-t", "1"]
    cmd += ["-D", str(max(1, round(duration))), "-H", f":authority: {variant.host}", variant.url]
    before = cpu_seconds(variant.proxies), cpu_seconds([app_pid])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    after = cpu_seconds(variant.proxies), cpu_seconds([app_pid])
    summary = h2load_summary(out)
    done = max(summary.done, 1)
    return {
        "rps": summary.rps,
        "non2xx": float(done - summary.ok),
        "proxies_us": (after[0] - before[0]) * 1e6 / done,
        "app_us": (after[1] - before[1]) * 1e6 / done,
    }


def mesh_stack(tmp: Path) -> tuple[MeshStack, Workload, Workload]:
    """Two workloads in ns1, mode NAMESPACE; the server's app is the upstream Envoy."""
    stack = MeshStack(tmp)
    try:
        workspace = stack.workspace("w", "ns1")
        stack.setting(stack.group(workspace, "g"), {"mode": "NAMESPACE"})
        client = stack.workload("client", "ns1", "sa-client")
        server = Workload(stack, "server", "ns1", "sa-server")
        server.node = dataclasses.replace(server.node, app_port=stack.upstream_port)
        stack.add(server)  # its pod in the inventory first: a sidecar is admitted by its pod
        stack.sidecars_converged()
    except BaseException:
        stack.close()
        raise
    return stack, client, server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per h2load run")
    parser.add_argument("--connections", type=int, default=8)
    args = parser.parse_args(argv)
    require_h2load()
    tmp = Path(tempfile.mkdtemp(prefix="bench-mesh-"))
    stack, client, server = mesh_stack(tmp)
    plain: list[EnvoyProcess] = []
    try:
        assert stack.upstream is not None
        app = stack.upstream.pid
        b_port, a_port = free_port(), free_port()
        plain.append(
            EnvoyProcess(
                plain_proxy(b_port, stack.upstream_port, free_port()), directory=tmp / "plain-b"
            ).start()
        )
        plain.append(
            EnvoyProcess(
                plain_proxy(a_port, b_port, free_port()), directory=tmp / "plain-a"
            ).start()
        )
        checked = client.call(server)
        assert checked.status_code == 200, checked.text
        variants = [
            Variant("direct", f"http://127.0.0.1:{stack.upstream_port}/", "app", []),
            Variant("plain", f"http://127.0.0.1:{a_port}/", "app", [p.pid for p in plain]),
            Variant(
                "mesh",
                f"http://127.0.0.1:{client.node.outbound_port}/",
                "server.ns1",
                [client.envoy_pid(), server.envoy_pid()],  # the sidecar agents' Envoys
            ),
        ]
        for variant in variants:  # each path answers before it is measured
            answer = httpx.get(variant.url, headers={"host": variant.host}, timeout=10)
            assert answer.status_code == 200, (variant.name, answer.status_code, answer.text)
        results: dict[str, list[dict[str, float]]] = {v.name: [] for v in variants}
        for _ in range(args.rounds):
            for variant in variants:
                results[variant.name].append(h2load(variant, app, args.connections, args.duration))
        print(report(results, args))
    finally:
        for proc in plain:
            proc.stop()
        stack.close()
    return 0


def report(results: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> str:
    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    lines = [
        f"rounds {args.rounds} x {args.duration:.0f} s, h2load --h1 -c {args.connections} -m 1;"
        f" medians; {load_note()}",
        "",
        "| variant | req/s | proxies' CPU per request | app's CPU per request | non-2xx |",
        "|---|---|---|---|---|",
    ]
    for name, runs in results.items():
        lines.append(
            f"| {name} | {med(name, 'rps'):,.0f} | {med(name, 'proxies_us'):.1f} µs"
            f" | {med(name, 'app_us'):.1f} µs | {sum(r['non2xx'] for r in runs):.0f} |"
        )
    ratio = med("mesh", "proxies_us") / max(med("plain", "proxies_us"), 1e-9)
    lines += [
        "",
        f"mesh hop (mTLS + RBAC) ÷ plain hop, proxies' CPU per request: {ratio:.2f}x"
        " (target ≤ 1.5x)",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
