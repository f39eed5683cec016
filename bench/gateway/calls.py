"""What the gateway Envoy spends on its ext_authz and rate-limit calls, by configuration.

    uv run python bench/gateway/calls.py [--rounds 5] [--duration 3] [--rate 1500]
                                         [--variants base,wide,...] [--path /on]
    uv run python bench/gateway/calls.py --instructions 300 [--variants base,wide,...]

Issue 26, item 5: the gateway Envoy's own CPU per request on ``/on`` (an
ext_authz Check, then a rate-limit call) is about 150 µs above ``/off``, where
both filters are off. This bench tells which configuration of the two filters
and of their gRPC clusters changes that, on equal terms:

1. The stack of ``bench/gateway/run.py`` (mgmt-api, Redis, ratelimit and
   extauthz on the ``h2`` server, the upstream Envoy) with one gateway
   configured over ADS, exactly as compiled.
2. That gateway's listener, routes and clusters are read back from its
   ``/config_dump`` and become static bootstraps, one Envoy per variant (one
   worker thread each), all calling the same two services: ``base`` is the
   compiled configuration unchanged, every other variant is it with one
   change (see :data:`VARIANTS`; ``wide`` is the configuration compiled
   before the Check was narrowed to the headers extauthz reads).
3. ``h2load --h1`` at a fixed offered rate (``--rate`` in total over 32
   connections; the same batching for every variant, which saturation on a
   shared machine would not give) against each variant in turn, alternated
   over ``--rounds`` rounds. The figure is the gateway Envoy's CPU per
   request from ``/proc`` (user + system); the services' CPU in the same
   run is printed beside it, so a change that moves work to a service shows.

Prints each round, then min / median / max per variant and the load average.

On a shared machine that CPU figure moves by tens of per cent between two
identical gateways. ``--instructions N`` counts instead, with callgrind, the
instructions each variant's Envoy runs per request over N sequential requests
on ``/off``, ``/authz`` and ``/on`` (after 20 warm-up requests): exact, and the
same within ~0.5 % from run to run whatever the neighbours do. It leaves out
the kernel's share (~10 % of the gateway's CPU here) and cache effects, so it
ranks configurations; the CPU mode says what a request costs.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench import h2grpc  # noqa: E402
from bench.gateway.run import SECRET, path_pids, setup  # noqa: E402
from extauthz.cli import mint_demo_token  # noqa: E402
from extauthz.contract import POLICY_CONTEXT_KEY  # noqa: E402
from meshplane.envoy_binary import envoy_path  # noqa: E402
from tests.mgmt_api.harness import ok  # noqa: E402
from tests.support.envoy import EnvoyProcess  # noqa: E402
from tests.support.gateway import CLUSTER_PATH, GatewayStack  # noqa: E402
from tests.support.net import free_port  # noqa: E402

Config = dict[str, Any]
EXT_AUTHZ = "envoy.filters.http.ext_authz"
RATELIMIT = "envoy.filters.http.ratelimit"
HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def dumped(envoy: EnvoyProcess) -> tuple[Config, Config, list[Config]]:
    """(listener, route configuration, clusters) an ADS-configured gateway runs."""
    dump = envoy.admin("GET", "/config_dump").json()["configs"]
    by_type = {c["@type"].rsplit(".", 1)[1]: c for c in dump}
    listener = by_type["ListenersConfigDump"]["dynamic_listeners"][0]["active_state"]["listener"]
    routes = by_type["RoutesConfigDump"]["dynamic_route_configs"][0]["route_config"]
    clusters = [c["cluster"] for c in by_type["ClustersConfigDump"]["dynamic_active_clusters"]]
    return listener, routes, clusters


def policy_name(stack: GatewayStack) -> str:
    """The ext_authz policy name the routes select (``/config_dump`` redacts it)."""
    document = ok(stack.admin.get(f"{CLUSTER_PATH}/envoyconfig"))
    for route in document["routes"]:
        settings = route["typedPerFilterConfig"].get(EXT_AUTHZ, {}).get("checkSettings")
        if settings:
            name: str = settings["contextExtensions"][POLICY_CONTEXT_KEY]
            return name
    raise LookupError("no ext_authz route in the envoyconfig document")


def unredacted(routes: Config, policy: str) -> Config:
    """``routes`` with the ``[redacted]`` context extensions set to ``policy`` again."""
    text = json.dumps(routes).replace('"[redacted]"', json.dumps(policy))
    restored: Config = json.loads(text)
    return restored


def static_bootstrap(listener: Config, routes: Config, clusters: list[Config], port: int) -> Config:
    """The dumped resources as one static bootstrap listening on ``port``."""
    listener = {k: v for k, v in copy.deepcopy(listener).items() if k != "@type"}
    listener["address"]["socket_address"]["port_value"] = port
    manager = _manager(listener)
    del manager["rds"]
    manager["route_config"] = {k: v for k, v in routes.items() if k != "@type"}
    return {
        "node": {"id": "calls-bench", "cluster": "calls-bench"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {
            "listeners": [listener],
            "clusters": [
                {k: v for k, v in c.items() if k != "@type"} for c in copy.deepcopy(clusters)
            ],
        },
    }


def _manager(listener: Config) -> Config:
    manager: Config = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return manager


def _filter(config: Config, name: str) -> Config:
    manager = _manager(config["static_resources"]["listeners"][0])
    for f in manager["http_filters"]:
        if f["name"] == name:
            typed: Config = f["typed_config"]
            return typed
    raise KeyError(name)


def _grpc_clusters(config: Config) -> list[Config]:
    return [
        c for c in config["static_resources"]["clusters"] if c["name"] in ("extauthz", "ratelimit")
    ]


def _h2_options(cluster: Config) -> Config:
    options: Config = cluster["typed_extension_protocol_options"][HTTP_OPTIONS][
        "explicit_http_config"
    ]["http2_protocol_options"]
    return options


def raw_headers(config: Config) -> None:
    _filter(config, EXT_AUTHZ)["encode_raw_headers"] = True


def no_route_cache_clear(config: Config) -> None:
    _filter(config, EXT_AUTHZ)["clear_route_cache"] = False


def windows(config: Config) -> None:
    """Small HTTP/2 flow-control windows (the calls are a few hundred bytes)."""
    for cluster in _grpc_clusters(config):
        _h2_options(cluster).update(
            initial_stream_window_size=65536, initial_connection_window_size=1048576
        )


def big_windows(config: Config) -> None:
    for cluster in _grpc_clusters(config):
        _h2_options(cluster).update(
            initial_stream_window_size=16777216, initial_connection_window_size=16777216
        )


def runtime(**flags: Any) -> Callable[[Config], None]:
    def apply(config: Config) -> None:
        config["layered_runtime"] = {"layers": [{"name": "static", "static_layer": dict(flags)}]}

    return apply


def google_grpc(config: Config) -> None:
    """The filters call through the gRPC C++ client instead of Envoy's own."""
    targets = {}
    for cluster in _grpc_clusters(config):
        address = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"][
            "address"
        ]["socket_address"]
        targets[cluster["name"]] = f"{address['address']}:{address['port_value']}"
    ext = _filter(config, EXT_AUTHZ)["grpc_service"]
    ext.pop("envoy_grpc")
    ext["google_grpc"] = {"target_uri": targets["extauthz"], "stat_prefix": "extauthz"}
    rl = _filter(config, RATELIMIT)["rate_limit_service"]["grpc_service"]
    rl.pop("envoy_grpc")
    rl["google_grpc"] = {"target_uri": targets["ratelimit"], "stat_prefix": "ratelimit"}


def every_header(config: Config) -> None:
    """The Check carries every request header (as compiled before issue 26, item 5)."""
    _filter(config, EXT_AUTHZ).pop("allowed_headers")


def envoy_headers(config: Config) -> None:
    """Envoy's x-envoy-internal and x-forwarded-for on both filters' calls (as before)."""
    _filter(config, EXT_AUTHZ)["grpc_service"]["envoy_grpc"].pop("skip_envoy_headers")
    rl = _filter(config, RATELIMIT)["rate_limit_service"]["grpc_service"]
    rl["envoy_grpc"].pop("skip_envoy_headers")


def hpack_off(config: Config) -> None:
    """No HPACK dynamic table on the gRPC connections (static table and literals only)."""
    for cluster in _grpc_clusters(config):
        _h2_options(cluster)["hpack_table_size"] = 0


def no_stats_tags(config: Config) -> None:
    """No tag extraction from stat names (the default regexes run on each new stat)."""
    config["stats_config"] = {"use_all_default_tags": False}


def no_call_stats(config: Config) -> None:
    """No stats of the two gRPC clusters (a bootstrap ``stats_matcher``): what Envoy's
    per-call counters, gauges and ``upstream_rq_time`` histograms cost."""
    prefixes = [{"prefix": f"cluster.{name}."} for name in ("extauthz", "ratelimit")]
    config["stats_config"] = {"stats_matcher": {"exclusion_list": {"patterns": prefixes}}}


def no_call_histograms(config: Config) -> None:
    """As :func:`no_call_stats`, the histograms only (``upstream_rq_time`` ...)."""
    patterns = [
        {"safe_regex": {"regex": rf"^cluster\.{name}\..*(_time|_ms|_size)$"}}
        for name in ("extauthz", "ratelimit")
    ]
    config["stats_config"] = {"stats_matcher": {"exclusion_list": {"patterns": patterns}}}


def resource_exhausted(config: Config) -> None:
    _filter(config, RATELIMIT)["rate_limited_as_resource_exhausted"] = True


def no_request_id(config: Config) -> None:
    """No x-request-id generated (a UUID per request, and one more header to send)."""
    manager = _manager(config["static_resources"]["listeners"][0])
    manager["generate_request_id"] = False


def combined(*changes: Callable[[Config], None]) -> Callable[[Config], None]:
    def apply(config: Config) -> None:
        for change in changes:
            change(config)

    return apply


def _noop(config: Config) -> None:
    return None


VARIANTS: dict[str, Callable[[Config], None]] = {
    "base": _noop,
    "base2": _noop,  # the same again: the noise floor between two Envoys
    "wide": combined(every_header, envoy_headers),  # as compiled before
    "allhdrs": every_header,
    "envoyhdrs": envoy_headers,
    "raw": raw_headers,
    "nocache": no_route_cache_clear,
    "windows": windows,
    "bigwin": big_windows,
    "oghttp2": runtime(**{"envoy.reloadable_features.http2_use_oghttp2": True}),
    "nghttp2": runtime(**{"envoy.reloadable_features.http2_use_oghttp2": False}),
    "google": google_grpc,
    "hpack0": hpack_off,
    "notags": no_stats_tags,
    "nostats": no_call_stats,
    "nohist": no_call_histograms,
    "exhausted": resource_exhausted,
    "noreqid": no_request_id,
}


def system_seconds(pids: list[int]) -> float:
    """System (kernel) CPU seconds of ``pids``, in ``/proc/PID/stat`` ticks."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[12])
    return total / os.sysconf("SC_CLK_TCK")


def cpu_ns(pids: list[int]) -> int:
    """Nanoseconds on CPU of every thread of ``pids`` (``schedstat``: exact, where
    ``/proc/PID/stat`` counts 10 ms ticks)."""
    total = 0
    for pid in pids:
        for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
            try:
                total += int(stat.read_text().split()[0])
            except OSError:
                continue
    return total


def h2load(
    port: int, path: str, token: str, duration: float, rate: int, pids: dict[str, list[int]]
) -> dict[str, float]:
    """One run: req/s and each process's CPU µs per request."""
    cmd = ["h2load", "--h1", "-c", "32", "-m", "1", "-t", "1",
           "-D", str(max(1, round(duration))), "-H", f"authorization: Bearer {token}"]  # fmt: skip
    if rate:
        cmd += ["--rps", str(max(1, rate // 32))]
    cmd.append(f"http://127.0.0.1:{port}{path}")
    before = {k: cpu_ns(v) for k, v in pids.items()}
    ticks = h2grpc.cpu_seconds(pids["gateway"]), system_seconds(pids["gateway"])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    after = {k: cpu_ns(v) for k, v in pids.items()}
    sys_share = (system_seconds(pids["gateway"]) - ticks[1]) / max(
        h2grpc.cpu_seconds(pids["gateway"]) - ticks[0], 1e-9
    )
    summary = h2grpc.h2load_summary(out)
    if summary.ok != summary.done or summary.ok == 0:
        raise SystemExit(f"non-2xx answers from the gateway on {port}:\n{out}")
    result = {"rps": summary.rps, "sys": sys_share}
    for key, value in before.items():
        result[key] = (after[key] - value) / 1e3 / summary.ok
    return result


class CallgrindEnvoy:
    """An Envoy (one worker) under ``valgrind --tool=callgrind``: instructions counted
    exactly, whatever else the machine runs."""

    def __init__(self, config: Config, directory: Path, port: int) -> None:
        directory.mkdir(parents=True)
        self.directory, self.port = directory, port
        path = directory / "envoy.json"
        path.write_text(json.dumps(config))
        self.out = directory / "callgrind.out"
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={self.out}",
               str(envoy_path()), "-c", str(path), "--disable-hot-restart",
               "--concurrency", "1", "-l", "warning"]  # fmt: skip
        with open(directory / "valgrind.log", "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

    def wait_ready(self, path: str, token: str, timeout: float = 600) -> None:
        """Until the listener answers 200 (Envoy starts in ~30 s under callgrind)."""
        deadline = time.monotonic() + timeout
        headers = {"authorization": f"Bearer {token}"}
        url = f"http://127.0.0.1:{self.port}{path}"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"callgrind Envoy exited, see {self.directory}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, headers=headers, timeout=60).status_code == 200:
                    return
            time.sleep(1)
        raise TimeoutError(f"callgrind Envoy on {self.port} never answered 200")

    def instructions(self, path: str, token: str, requests: int) -> float:
        """Instructions per request over ``requests`` sequential requests on one connection."""
        subprocess.run(["callgrind_control", "-z", str(self.proc.pid)], check=True,
                       capture_output=True)  # fmt: skip
        url = f"http://127.0.0.1:{self.port}{path}"
        cmd = ["h2load", "--h1", "-c", "1", "-n", str(requests),
               "-H", f"authorization: Bearer {token}", url]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        summary = h2grpc.h2load_summary(out)
        if summary.ok != requests:
            raise RuntimeError(f"{summary.ok} of {requests} answered 2xx on {path}")
        before = set(self.directory.glob("callgrind.out.*"))
        subprocess.run(["callgrind_control", "-d", str(self.proc.pid)], check=True,
                       capture_output=True)  # fmt: skip
        (dump,) = set(self.directory.glob("callgrind.out.*")) - before
        for line in dump.read_text().splitlines():
            if line.startswith("summary:"):
                return int(line.split()[1]) / requests
        raise RuntimeError(f"no summary in {dump}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)


def instruction_counts(
    configs: dict[str, Config], tmp: Path, paths: list[str], token: str, requests: int
) -> dict[str, dict[str, float]]:
    """Instructions per request of each variant on each path (started side by side)."""
    envoys = {}
    try:
        for name, config in configs.items():
            port = config["static_resources"]["listeners"][0]["address"]["socket_address"]
            envoys[name] = CallgrindEnvoy(config, tmp / f"cg-{name}", port["port_value"])
        counts: dict[str, dict[str, float]] = {}
        for name, envoy in envoys.items():
            envoy.wait_ready(paths[0], token)
            for path in paths:
                envoy.instructions(path, token, 20)  # warm-up: connections, caches
                counts.setdefault(name, {})[path] = envoy.instructions(path, token, requests)
            print(f"  {name:<10} " + "  ".join(f"{p} {counts[name][p]:9.0f}" for p in paths))
        return counts
    finally:
        for envoy in envoys.values():
            envoy.stop()


def print_instructions(counts: dict[str, dict[str, float]], paths: list[str], base: str) -> None:
    print("\n## Gateway Envoy instructions per request (callgrind, sequential requests)\n")
    print("| variant | " + " | ".join(f"{p} | vs {base}" for p in paths) + " |")
    print("|---|" + "---|---|" * len(paths))
    for name, by_path in counts.items():
        cells = [f"{by_path[p]:.0f} | {by_path[p] - counts[base][p]:+.0f}" for p in paths]
        print(f"| {name} | " + " | ".join(cells) + " |")


def cpu_rounds(
    gateways: dict[str, tuple[int, dict[str, list[int]]]],
    args: argparse.Namespace,
    token: str,
) -> dict[str, list[dict[str, float]]]:
    """Each variant's CPU per request, rounds alternated (see the module docstring)."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in gateways}
    for port, pids in gateways.values():  # warm-up: connections, caches
        h2load(port, args.path, token, 1, args.rate, pids)
    order = list(gateways.items())
    for index in range(args.rounds):
        # Each round starts one variant later: no variant always runs
        # right after the same neighbour.
        shift = index % len(order)
        for name, (port, pids) in order[shift:] + order[:shift]:
            result = h2load(port, args.path, token, args.duration, args.rate, pids)
            runs[name].append(result)
            print(
                f"  round {index + 1} {name:<10} {result['rps']:7.0f} req/s  "
                f"gateway {result['gateway']:6.1f}  extauthz {result['extauthz']:5.1f}  "
                f"ratelimit {result['ratelimit']:5.1f} µs/req  sys {result['sys']:.0%}",
                flush=True,
            )
    return runs


def print_cpu(runs: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> None:
    offered = f"{args.rate} req/s offered" if args.rate else "saturation"
    print(f"\n## Gateway CPU µs/request on {args.path}, h2load --h1 -c 32, {offered}\n")
    print("| variant | req/s | gateway min | median | max | vs first | extauthz | ratelimit |")
    print("|---|---|---|---|---|---|---|---|")
    base = statistics.median(r["gateway"] for r in next(iter(runs.values())))
    for name, samples in runs.items():
        cpu = [r["gateway"] for r in samples]
        med = statistics.median(cpu)
        cells = [
            f"{statistics.median(r['rps'] for r in samples):.0f}",
            f"{min(cpu):.1f}",
            f"{med:.1f}",
            f"{max(cpu):.1f}",
            f"{med - base:+.1f}",
            f"{statistics.median(r['extauthz'] for r in samples):.1f}",
            f"{statistics.median(r['ratelimit'] for r in samples):.1f}",
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per h2load run")
    parser.add_argument("--rate", type=int, default=1500, help="offered req/s (0: saturation)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--path", default="/on")
    parser.add_argument(
        "--instructions",
        type=int,
        default=0,
        metavar="N",
        help="instead of CPU time: callgrind's instruction count per request over N "
        "sequential requests on /off, /authz and /on",
    )
    args = parser.parse_args()
    h2grpc.require_h2load()
    names = args.variants.split(",")
    token = mint_demo_token(SECRET, "/", 3600)
    with tempfile.TemporaryDirectory(prefix="bench-calls-") as tmp:
        (Path(tmp) / "stack").mkdir()
        stack = GatewayStack(Path(tmp) / "stack", service_args=("--server", "h2"))
        started: list[EnvoyProcess] = []
        try:
            setup(stack, 1)
            listener, routes, clusters = dumped(stack.gateways[0].envoy)
            routes = unredacted(routes, policy_name(stack))
            configs = {}
            for name in names:
                configs[name] = static_bootstrap(listener, routes, clusters, free_port())
                VARIANTS[name](configs[name])
            if args.instructions:
                paths = ["/off", "/authz", "/on"]
                counts = instruction_counts(configs, Path(tmp), paths, token, args.instructions)
                print_instructions(counts, paths, names[0])
                return 0
            services = path_pids(stack)
            gateways: dict[str, tuple[int, dict[str, list[int]]]] = {}
            for name, config in configs.items():
                envoy = EnvoyProcess(config, Path(tmp) / name).start()
                started.append(envoy)
                pids = {k: services[k] for k in ("extauthz", "ratelimit", "redis")}
                port = config["static_resources"]["listeners"][0]["address"]["socket_address"]
                pids["gateway"] = h2grpc.process_tree(envoy.pid)
                gateways[name] = (port["port_value"], pids)
            print_cpu(cpu_rounds(gateways, args, token), args)
        finally:
            for envoy in started:
                envoy.stop()
            stack.close()
    print(f"\n{h2grpc.load_note()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
