"""The one-thread h2c server (``bench/h2_floor.py``) against pyvoy's floor and native Envoy.

    uv run python bench/h2_floor_bench.py [--rounds 3] [--duration 4] [--gateway-like 1000]
                                           [--isolated] [--strace]

Issue 26, item 5. It first checks that every server answers real gRPC
correctly, and refuses to print a figure otherwise:

- grpcio calls to ``h2-floor`` and ``h2-floor-nocache`` (the no-op: its
  fixed answer, 200 calls on one channel, 64 over 8 threads, and one 300 kB
  request that needs the server's WINDOW_UPDATEs) and to ``h2-check``
  (Check allow with a valid HS256 token, deny with a forged one,
  UNIMPLEMENTED for an unknown method), and the same allow/deny on ``ours``;
- one real Envoy whose ext_authz filter calls ``h2-check`` over gRPC (the
  client Envoy's gateways use): a valid token passes (200), a forged one is
  refused (403).

Then, in one run, interleaved over ``--rounds`` (one worker each; medians):
``envoy-direct`` (native), ``asgi-noop`` (pyvoy's floor), ``h2-floor``,
``h2-floor-nocache`` (the same without its header-block cache: every block
decoded by the pure-Python ``hpack``), ``h2-check`` and ``ours``
(``extauthz serve``, pyvoy), at saturation (16 x 8) and gateway-like (4 x 1
at ``--gateway-like`` req/s), and with ``--isolated`` also 1 x 1 at that
rate, with ``bench/h2grpc.py``'s h2load and /proc machinery. Every measured
run must have 0 failed requests, and the grpcio checks are run again after
the measurements (h2load sees HTTP statuses only). With ``--strace``,
system calls per call of h2-floor and asgi-noop at gateway-like
(``strace -c -f``, counts only).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "bench", ROOT / "bench/extauthz"):
    sys.path.insert(0, str(_path))

import h2grpc  # noqa: E402
from h2grpc import Run, Server, Target, asgi_noop, envoy_direct  # noqa: E402

from bench import (  # noqa: E402  (bench/extauthz)
    ALLOW,
    METHOD,
    check_request,
    expect_status,
    grpc_frame,
    ours,
    write_config,
)
from meshplane.envoy_binary import ensure_envoy_api, envoy_path  # noqa: E402
from tests.support.envoy import ext_authz_gateway_bootstrap  # noqa: E402
from tests.support.net import free_port  # noqa: E402

NOOP_PATH = "/bench.Noop/Call"
BASELINES = ("envoy-direct", "asgi-noop")


def h2_floor(
    response: bytes, check: Path | None = None, *, cache: bool = True
) -> contextlib.AbstractContextManager[Server]:
    """``bench/h2_floor.py``: the no-op, or the real Check with ``check``'s config."""
    port = free_port()
    cmd = [sys.executable, str(ROOT / "bench/h2_floor.py"), "--port", str(port),
           "--response-hex", response.hex()]  # fmt: skip
    name = "h2-floor"
    if check is not None:
        cmd, name = [*cmd, "--check", str(check)], "h2-check"
    if not cache:
        cmd, name = [*cmd, "--no-header-cache"], f"{name}-nocache"
    return h2grpc.started(name, cmd, port, health=False)


def verify_noop(port: int, response: bytes) -> None:
    """grpcio gets the no-op's answer: one call, 200 on a channel, 8 at once, 300 kB in."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(NOOP_PATH)
        for _ in range(200):
            if call(b"x", timeout=5) != response[5:]:
                raise SystemExit("h2-floor answered something else than its fixed answer")
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            replies = list(pool.map(lambda _: call(b"y" * 100, timeout=5), range(64)))
        if set(replies) != {response[5:]}:
            raise SystemExit("h2-floor answered concurrent calls wrongly")
        if call(b"z" * 300_000, timeout=10) != response[5:]:
            raise SystemExit("h2-floor answered a 300 kB request wrongly")


def verify_check(port: int, bodies: dict[str, Path]) -> None:
    """Check allows the valid token, denies the forged one; an unknown method is UNIMPLEMENTED."""
    expect_status(port, bodies["hs256"], 0)
    expect_status(port, bodies["denied"], 7)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            unknown: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary("/no.Such/M")
            unknown(b"", timeout=5)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise SystemExit(f"unknown method answered {exc.code()}") from exc
        else:
            raise SystemExit("unknown method answered OK")


@contextlib.contextmanager
def envoy_ext_authz(authz_port: int, workdir: Path) -> Iterator[int]:
    """A real Envoy whose ext_authz filter calls ``authz_port`` over gRPC; yields its port."""
    port = free_port()
    config = ext_authz_gateway_bootstrap(authz_port, port, timeout="2s")
    path = workdir / f"ext-authz-{port}.json"
    path.write_text(json.dumps(config))
    ensure_envoy_api()
    cmd = [str(envoy_path()), "-c", str(path), "--concurrency", "1",
           "--use-dynamic-base-id", "--log-level", "error"]  # fmt: skip
    with subprocess.Popen(cmd, stdout=subprocess.DEVNULL) as proc:
        try:
            yield port
        finally:
            proc.terminate()
            proc.wait(30)


def http_status(port: int, token: str, timeout: float = 60.0) -> int:
    """GET /headers through Envoy with ``token``; retried until Envoy listens."""
    deadline = time.monotonic() + timeout
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/headers", headers={"Authorization": f"Bearer {token}"}
    )
    while True:
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def verify_through_envoy(authz_port: int, tokens: dict[str, str], workdir: Path) -> None:
    with envoy_ext_authz(authz_port, workdir) as port:
        allowed, denied = http_status(port, tokens["hs"]), http_status(port, tokens["forged"])
    if (allowed, denied) != (200, 403):
        raise SystemExit(f"Envoy's ext_authz through h2-check: {allowed}, {denied} (want 200, 403)")
    print("  Envoy ext_authz -> h2-check: valid token 200, forged token 403", flush=True)


def strace_counts(servers: list[Server], body: Path, rate: int, workdir: Path) -> None:
    """System calls per call at gateway-like (server_anatomy's strace -c -f, counts only)."""
    import server_anatomy  # noqa: PLC0415

    counted = {}
    for server in servers:
        cmd = ["h2load", "-D", "4", "-c", "4", "-m", "1", "-t", "1", "-d", str(body),
               "--rps", str(rate // 4)]  # fmt: skip
        for header in h2grpc.GRPC_HEADERS:
            cmd += ["-H", header]
        cmd.append(f"http://127.0.0.1:{server.port}{NOOP_PATH}")
        counted[server.name] = server_anatomy.syscalls(server, cmd, workdir)
    names = list(counted)
    calls = sorted({c for per in counted.values() for c, n in per.items() if n >= 0.05})
    print(f"\n## System calls per call, gateway-like {rate}/s (strace -c -f, one run each)\n")
    print("| syscall | " + " | ".join(names) + " |\n|---|" + "---|" * len(names))
    for call in calls:
        print(f"| {call} | " + " | ".join(f"{counted[n].get(call, 0.0):.2f}" for n in names) + " |")
    print("| **all** | " + " | ".join(f"{sum(counted[n].values()):.2f}" for n in names) + " |")


def isolated_mode(rate: int) -> str:
    return f"isolated {rate}/s"


def measure_rounds(targets: list[Target], args: argparse.Namespace, workdir: Path) -> list[Run]:
    """``h2grpc.rounds``, and with ``--isolated`` one more run per target and round at
    1 connection x 1 stream: h2load's rate timer sends the gateway-like mode's 4
    connections' calls at the same instant, so a server that reads them in one
    wake-up shares it; a gateway's calls, unsynchronised, often arrive alone."""
    if not args.isolated:
        return h2grpc.rounds(targets, 1, args, workdir)
    results: list[Run] = []
    for index in range(args.rounds):
        print(f" round {index + 1}/{args.rounds}", flush=True)
        for target in targets:
            results += h2grpc.measure(
                target, 1, duration=args.duration, rates=[], workdir=workdir,
                gateway_like=args.gateway_like,
            )  # fmt: skip
            result = h2grpc.h2load(
                target.server, target.path, target.body, duration=args.duration,
                clients=1, streams=1, rate=args.gateway_like, workdir=workdir,
            )  # fmt: skip
            run = Run(target.case, 1, isolated_mode(args.gateway_like), *result)
            h2grpc._print_runs([run])  # the one printer of a run
            results.append(run)
    return results


def summary(results: list[Run], mode: str) -> str:
    """Medians per case in ``mode``, with CPU per call as a ratio to native and to the floor."""
    lines = [
        f"| case ({mode}) | CPU µs/call | csw/call | p50 ms | p99 ms | req/s | "
        "CPU ÷ envoy-direct | CPU ÷ asgi-noop |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def median(case: str, attr: str) -> float:
        return statistics.median(
            float(getattr(r, attr)) for r in results if (r.case, r.mode) == (case, mode)
        )

    cases = list(dict.fromkeys(r.case for r in results if r.mode == mode))
    for case in cases:
        cpu = median(case, "cpu_us")
        ratios = " | ".join(f"{cpu / median(base, 'cpu_us'):.2f}x" for base in BASELINES)
        lines.append(
            f"| {case} | {cpu:.1f} | {median(case, 'switches'):.2f} | {median(case, 'p50_ms'):.2f} "
            f"| {median(case, 'p99_ms'):.2f} | {median(case, 'rps'):.0f} | {ratios} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--gateway-like", type=int, default=1000, metavar="RPS")
    parser.add_argument("--strace", action="store_true")
    parser.add_argument(
        "--isolated",
        action="store_true",
        help="also one connection x 1 stream at the gateway-like rate: calls that arrive "
        "alone (h2load's --rps sends the 4 connections' calls together)",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.rates = []
    h2grpc.require_h2load()
    started_at = time.strftime("%Y-%m-%d %H:%M")
    with tempfile.TemporaryDirectory(prefix="h2-floor-") as tmp, contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        config, tokens = write_config(workdir, 10_000)
        bodies = {}
        for case, token in (("hs256", tokens["hs"]), ("denied", tokens["forged"])):
            bodies[case] = workdir / f"{case}.bin"
            bodies[case].write_bytes(grpc_frame(check_request(token, None).SerializeToString()))
        answer = grpc_frame(ALLOW)
        direct = stack.enter_context(envoy_direct(1, answer, workdir))
        noop = stack.enter_context(asgi_noop(1, answer))
        floor = stack.enter_context(h2_floor(answer))
        uncached = stack.enter_context(h2_floor(answer, cache=False))
        check = stack.enter_context(h2_floor(answer, config))
        pyvoy = stack.enter_context(ours(config, 1, "envoy"))
        verify_noop(floor.port, answer)
        verify_noop(uncached.port, answer)
        verify_check(check.port, bodies)
        expect_status(pyvoy.port, bodies["hs256"], 0)
        expect_status(pyvoy.port, bodies["denied"], 7)
        print("  grpcio: h2-floor, h2-check and ours answer correctly", flush=True)
        verify_through_envoy(check.port, tokens, workdir)
        targets = [
            Target("envoy-direct", direct, METHOD, bodies["hs256"]),
            Target("asgi-noop", noop, METHOD, bodies["hs256"]),
            Target("h2-floor", floor, METHOD, bodies["hs256"]),
            Target("h2-floor-nocache", uncached, METHOD, bodies["hs256"]),
            Target("h2-check", check, METHOD, bodies["hs256"]),
            Target("ours", pyvoy, METHOD, bodies["hs256"]),
        ]
        results = measure_rounds(targets, args, workdir)
        # Still right after being driven hard (h2load sees HTTP statuses, not grpc-status).
        verify_noop(floor.port, answer)
        verify_noop(uncached.port, answer)
        verify_check(check.port, bodies)
        expect_status(pyvoy.port, bodies["hs256"], 0)
        failed = [r for r in results if r.failed or not r.done]
        if failed:
            raise SystemExit(f"failed requests, no figures: {failed}")
        if args.strace:
            strace_counts([floor, noop], bodies["hs256"], args.gateway_like, workdir)
    print()
    modes = ["saturation", h2grpc.gateway_mode(args.gateway_like)]
    if args.isolated:
        modes.append(isolated_mode(args.gateway_like))
    for mode in modes:
        print(summary(results, mode) + "\n")
    print(f"{args.rounds} rounds interleaved, medians; started {started_at}; {h2grpc.load_note()}")
    h2grpc.write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
