"""Benchmark of the ext_authz server with h2load (Debian ``nghttp2-client``).

Cases, side by side, at each worker count:

* ``baseline``: ``noop_server.py``, a Check that always allows, on the same
  runtime (so the ratio isolates our decision logic from grpcio's cost);
* ``hs256`` / ``rs256`` / ``es256``: our server with a valid token (the
  verified-token cache makes repeat tokens a dict hit);
* ``denied``: a forged HS256 token (bad signature: never cached, so every
  request pays a full verification; attack traffic looks like this);
* ``http``: the same HS256 request through the HTTP ``http_service`` mode;
* with ``--uncached`` (1 worker): the three valid tokens with
  ``tokenCacheSize: 0`` to show raw verification cost.

gRPC requests are POSTs of a 5-byte gRPC frame prefix + the serialized
CheckRequest, ``content-type: application/grpc``, ``te: trailers``, over h2c.
Throughput is measured at saturation (16 connections x 8 streams for gRPC,
64 HTTP/1.1 connections for the HTTP mode); latency (p50/p99) at a fixed
offered rate with ``h2load --rps`` (default 1000 req/s in total), because at
saturation latency is only queueing. Server CPU per request comes from
``/proc/<pid>/stat`` (utime+stime of the supervisor and its workers) before
and after each run.

The baseline and our server run at the same time and the cases interleave
over ``--rounds`` rounds; the table shows medians. ``ratio req/s`` is ours
over the baseline; ``ratio CPU`` is baseline CPU/request over ours, the
steadier of the two on a shared machine (both are "fraction of baseline
throughput": 1.0 means no overhead).

    uv run python bench/extauthz/bench.py                 # 1 and 2 workers, 3 rounds
    uv run python bench/extauthz/bench.py --workers 1 --rounds 1 --duration 2
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from envoy.service.auth.v3 import attribute_context_pb2, external_auth_pb2, external_auth_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
METHOD = "/envoy.service.auth.v3.Authorization/Check"
SECRET = "bench-secret-0123456789abcdef-0123456789"
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class Run:
    case: str
    workers: int
    mode: str  # "saturation" or "rate"
    rps: float
    p50_ms: float
    p99_ms: float
    cpu_us_per_req: float
    requests: int
    failed: int


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    grpc_port: int
    http_port: int | None = None
    pids: list[int] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            out.append(int(entry))
    return out


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / CLK_TCK


def write_config(directory: Path, cache_size: int) -> tuple[Path, dict[str, str]]:
    """Policies for HS256/RS256/ES256 and valid + forged tokens for them."""
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    for name, key in (("rsa.pem", rsa_key), ("ec.pem", ec_key)):
        pem = key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
        (directory / name).write_bytes(pem)
    (directory / "hs.secret").write_text(SECRET)
    config = directory / f"bench-{cache_size}.yaml"
    config.write_text(
        f"""
defaultPolicy: hs
tokenCacheSize: {cache_size}
policies:
  - name: hs
    jwt: {{algorithms: [HS256], keys: [{{hmacSecret: {{file: hs.secret}}}}]}}
    pathClaim: {{name: path, match: SEGMENT}}
  - name: rs
    jwt: {{algorithms: [RS256], keys: [{{publicKeyPem: {{file: rsa.pem}}}}]}}
    pathClaim: {{name: path, match: SEGMENT}}
  - name: es
    jwt: {{algorithms: [ES256], keys: [{{publicKeyPem: {{file: ec.pem}}}}]}}
    pathClaim: {{name: path, match: SEGMENT}}
"""
    )
    now = int(time.time())
    claims = {
        "path": base64.b64encode(b"/headers").decode(),
        "nbf": now - 60,
        "exp": now + 86400,
        "sub": "bench-user",
    }
    tokens = {
        "hs": jwt.encode(claims, SECRET, algorithm="HS256"),
        "rs": jwt.encode(claims, rsa_key, algorithm="RS256"),
        "es": jwt.encode(claims, ec_key, algorithm="ES256"),
        "forged": jwt.encode(claims, "not-the-secret-0123456789abcdef-012345", algorithm="HS256"),
    }
    return config, tokens


def check_request(token: str, policy: str | None) -> external_auth_pb2.CheckRequest:
    """A CheckRequest shaped like Envoy's for GET /headers (about 600 bytes)."""
    http = attribute_context_pb2.AttributeContext.HttpRequest(
        id="3a6f5c1e-0d7b-4a7e-9f1e-5b2f7c9d8e10",
        method="GET",
        path="/headers?show_env=1",
        host="httpbin.example",
        scheme="http",
        protocol="HTTP/1.1",
        size=-1,
    )
    http.headers.update(
        {
            ":authority": "httpbin.example",
            ":method": "GET",
            ":path": "/headers?show_env=1",
            ":scheme": "http",
            "accept": "*/*",
            "user-agent": "curl/8.5.0",
            "x-forwarded-proto": "http",
            "x-request-id": "3a6f5c1e-0d7b-4a7e-9f1e-5b2f7c9d8e10",
            "authorization": f"Bearer {token}",
        }
    )
    attrs = attribute_context_pb2.AttributeContext(
        request=attribute_context_pb2.AttributeContext.Request(http=http)
    )
    if policy:
        attrs.context_extensions["meshplane.policy"] = policy
    return external_auth_pb2.CheckRequest(attributes=attrs)


def grpc_frame(message: bytes) -> bytes:
    return struct.pack(">?I", False, len(message)) + message


def wait_ready(port: int, request: external_auth_pb2.CheckRequest, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = external_auth_pb2_grpc.AuthorizationStub(channel)
    try:
        while True:
            try:
                stub.Check(request, timeout=2)
                return
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        channel.close()


def expect_status(port: int, request: external_auth_pb2.CheckRequest, code: int) -> None:
    """Sanity check before measuring: the case really is an allow (0) or deny (7)."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = external_auth_pb2_grpc.AuthorizationStub(channel)
        response = stub.Check(request, timeout=5)
    if response.status.code != code:
        raise SystemExit(f"unexpected status {response.status.code} (wanted {code})")


def start_server(cmd: list[str], grpc_port: int, http_port: int | None, probe: bytes) -> Server:
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_ready(grpc_port, external_auth_pb2.CheckRequest.FromString(probe))
    time.sleep(1.0)  # let every worker finish starting
    return Server(proc, grpc_port, http_port, [proc.pid, *children(proc.pid)])


def stop_server(server: Server) -> None:
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(20)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


def h2load(
    url: str,
    *,
    server: Server,
    duration: float,
    clients: int,
    streams: int,
    body: Path | None = None,
    headers: tuple[str, ...] = (),
    rps: int | None = None,
    h1: bool = False,
    workdir: Path,
) -> tuple[float, float, float, float, int, int]:
    """Run h2load; return (req/s, p50 ms, p99 ms, server CPU µs/req, done, failed)."""
    log = workdir / "h2load.log"
    log.unlink(missing_ok=True)
    cmd = [
        "h2load",
        "-D",
        str(max(1, round(duration))),
        "-c",
        str(clients),
        "-m",
        str(streams),
        "-t",
        "1",
    ]
    cmd += ["--log-file", str(log)]
    if body is not None:
        cmd += ["-d", str(body)]
    for header in headers:
        cmd += ["-H", header]
    if rps is not None:
        cmd += ["--rps", str(rps)]
    if h1:
        cmd.append("--h1")
    cmd.append(url)
    before = cpu_seconds(server.pids)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    after = cpu_seconds(server.pids)
    rps_line = next(line for line in out.splitlines() if line.startswith("finished in"))
    req_s = float(rps_line.split(",")[1].split()[0])
    req_line = next(line for line in out.splitlines() if line.startswith("requests:"))
    numbers = [int(part.split()[0]) for part in req_line.split(":", 1)[1].split(",")]
    done, failed = numbers[2], numbers[4]
    latencies = sorted(int(line.split("\t")[2]) for line in log.read_text().splitlines() if line)
    if not latencies:
        return req_s, 0.0, 0.0, 0.0, done, failed
    p50 = statistics.median(latencies) / 1000
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] / 1000
    cpu = (after - before) * 1e6 / max(done, 1)
    return req_s, p50, p99, cpu, done, failed


@dataclass(frozen=True)
class Target:
    """One measured case: where to send what."""

    case: str
    server: Server
    url: str
    body: Path | None = None
    headers: tuple[str, ...] = ()
    h1: bool = False
    latency: bool = False


def measure(target: Target, workers: int, args: argparse.Namespace, workdir: Path) -> list[Run]:
    """One saturation run (after a 1 s warm-up) and, if asked, one fixed-rate run."""
    clients, streams = (64, 1) if target.h1 else (16, 8)
    common = {
        "server": target.server,
        "body": target.body,
        "headers": target.headers,
        "h1": target.h1,
        "workdir": workdir,
    }
    h2load(target.url, duration=1, clients=clients, streams=streams, **common)  # type: ignore[arg-type]
    runs = []
    rps, p50, p99, cpu, done, failed = h2load(
        target.url,
        duration=args.duration,
        clients=clients,
        streams=streams,
        **common,  # type: ignore[arg-type]
    )
    runs.append(Run(target.case, workers, "saturation", rps, p50, p99, cpu, done, failed))
    if target.latency:
        per_client = max(1, args.rate // 4)
        rps, p50, p99, cpu, done, failed = h2load(
            target.url,
            duration=args.duration,
            clients=4,
            streams=1,
            rps=per_client,
            **common,  # type: ignore[arg-type]
        )
        runs.append(Run(target.case, workers, "rate", rps, p50, p99, cpu, done, failed))
    for run in runs:
        print(
            f"  {run.case:<14} {run.mode:<10} {run.rps:7.0f} req/s  p50 {run.p50_ms:6.2f} ms  "
            f"p99 {run.p99_ms:6.2f} ms  cpu {run.cpu_us_per_req:5.0f} µs/req  failed {run.failed}",
            flush=True,
        )
    return runs


def grpc_body(workdir: Path, case: str, token: str, policy: str | None) -> Path:
    path = workdir / f"{case}.bin"
    path.write_bytes(grpc_frame(check_request(token, policy).SerializeToString()))
    return path


def bench_workers(
    workers: int, args: argparse.Namespace, workdir: Path, results: list[Run]
) -> None:
    """Baseline and our server run side by side; cases interleave for ``rounds``.

    Interleaving matters on a shared machine: neighbours' load drifts over
    minutes, and comparing a baseline measured at one moment with our
    server measured at another would mostly measure that drift.
    """
    config, tokens = write_config(workdir, 10_000)
    grpc_headers = ("content-type: application/grpc", "te: trailers")
    probe = check_request(tokens["hs"], None).SerializeToString()
    print(f"workers={workers}", flush=True)
    noop_port, port, http_port = free_port(), free_port(), free_port()
    noop = start_server(
        [
            sys.executable,
            "bench/extauthz/noop_server.py",
            "--listen",
            f"127.0.0.1:{noop_port}",
            "--workers",
            str(workers),
        ],
        noop_port,
        None,
        probe,
    )
    ours = None
    try:
        ours = start_server(
            [
                sys.executable,
                "-m",
                "extauthz.cli",
                "serve",
                "--config",
                str(config),
                "--listen",
                f"127.0.0.1:{port}",
                "--http-listen",
                f"127.0.0.1:{http_port}",
                "--workers",
                str(workers),
            ],
            port,
            http_port,
            probe,
        )
        url = f"http://127.0.0.1:{port}{METHOD}"
        targets = [
            Target(
                "baseline",
                noop,
                f"http://127.0.0.1:{noop_port}{METHOD}",
                grpc_body(workdir, "baseline", tokens["hs"], None),
                grpc_headers,
                latency=True,
            ),
            Target(
                "hs256",
                ours,
                url,
                grpc_body(workdir, "hs256", tokens["hs"], None),
                grpc_headers,
                latency=True,
            ),
            Target(
                "rs256", ours, url, grpc_body(workdir, "rs256", tokens["rs"], "rs"), grpc_headers
            ),
            Target(
                "es256", ours, url, grpc_body(workdir, "es256", tokens["es"], "es"), grpc_headers
            ),
            Target(
                "denied",
                ours,
                url,
                grpc_body(workdir, "denied", tokens["forged"], None),
                grpc_headers,
            ),
            Target(
                "http-hs256",
                ours,
                f"http://127.0.0.1:{http_port}/check/-/headers?show_env=1",
                headers=(f"authorization: Bearer {tokens['hs']}",),
                h1=True,
                latency=True,
            ),
        ]
        for target in targets[1:-1]:
            assert target.body is not None
            request = external_auth_pb2.CheckRequest.FromString(target.body.read_bytes()[5:])
            expect_status(port, request, 7 if target.case == "denied" else 0)
        for round_index in range(args.rounds):
            print(f" round {round_index + 1}/{args.rounds}", flush=True)
            for target in targets:
                results.extend(measure(target, workers, args, workdir))
    finally:
        stop_server(noop)
        if ours is not None:
            stop_server(ours)

    if args.uncached and workers == 1:
        config, tokens = write_config(workdir, 0)
        port = free_port()
        uncached = start_server(
            [
                sys.executable,
                "-m",
                "extauthz.cli",
                "serve",
                "--config",
                str(config),
                "--listen",
                f"127.0.0.1:{port}",
                "--workers",
                "1",
            ],
            port,
            None,
            check_request(tokens["hs"], None).SerializeToString(),
        )
        url = f"http://127.0.0.1:{port}{METHOD}"
        try:
            for case, token, policy in (
                ("hs256-nocache", tokens["hs"], None),
                ("rs256-nocache", tokens["rs"], "rs"),
                ("es256-nocache", tokens["es"], "es"),
            ):
                body = grpc_body(workdir, case, token, policy)
                results.extend(
                    measure(Target(case, uncached, url, body, grpc_headers), workers, args, workdir)
                )
        finally:
            stop_server(uncached)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def report(results: list[Run]) -> str:
    """Medians over rounds; ratios against the baseline at the same worker count."""
    lines = [
        "| workers | case | mode | req/s | ratio req/s | ratio CPU | p50 ms | p99 ms "
        "| server CPU µs/req | runs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    keys: list[tuple[int, str, str]] = []
    for run in results:
        key = (run.workers, run.case, run.mode)
        if key not in keys:
            keys.append(key)
    for workers, case, mode in keys:
        runs = [r for r in results if (r.workers, r.case, r.mode) == (workers, case, mode)]
        base = [r for r in results if (r.workers, r.case, r.mode) == (workers, "baseline", mode)]
        rps = _median([r.rps for r in runs])
        cpu = _median([r.cpu_us_per_req for r in runs])
        base_rps = _median([r.rps for r in base])
        base_cpu = _median([r.cpu_us_per_req for r in base])
        saturation = mode == "saturation" and base_rps > 0
        ratio_rps = f"{rps / base_rps:.2f}" if saturation else "-"
        ratio_cpu = f"{base_cpu / cpu:.2f}" if saturation and cpu > 0 else "-"
        lines.append(
            f"| {workers} | {case} | {mode} | {rps:.0f} | {ratio_rps} | {ratio_cpu} | "
            f"{_median([r.p50_ms for r in runs]):.2f} | {_median([r.p99_ms for r in runs]):.2f} "
            f"| {cpu:.0f} | {len(runs)} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians)")
    parser.add_argument("--rate", type=int, default=1000, help="total offered req/s for latency")
    parser.add_argument("--uncached", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args()
    if shutil.which("h2load") is None:
        print("h2load not found: apt-get install -y nghttp2-client", file=sys.stderr)
        return 2
    results: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="extauthz-bench-") as tmp:
        for workers in args.workers:
            bench_workers(workers, args, Path(tmp), results)
    print()
    print(report(results))
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in results], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
