"""Benchmark of the ext_authz Check with h2load (Debian ``nghttp2-client``).

In one run, interleaved over ``--rounds`` rounds, at each worker count
(``bench/h2grpc.py`` explains the method and the floors):

* ``envoy-direct``: Envoy's ``direct_response`` (no Python): the native limit;
* ``asgi-noop``: a raw ASGI no-op on pyvoy: the floor of our default server;
* ``hs256``: ``extauthz serve`` (Envoy-based server) with a valid HS256 token
  (the verified-token cache makes a repeat token a dict hit);
* ``denied``: the same server, one forged HS256 token repeated (bad
  signature: verified once, then its refusal is a dict hit; attack traffic
  with a fresh forged token per call pays a verification each time);
* ``hs256-h2``: ``extauthz serve --server h2`` (meshplane's own one-thread
  HTTP/2 server), valid token;
* ``hs256-2threads`` (1 worker only): one worker with 2 Envoy threads, to
  compare with 2 worker processes (the ``hs256`` row at 2 workers).

Requests are POSTs of a 5-byte gRPC prefix + a ~600-byte CheckRequest shaped
like Envoy's, over h2c. Every case is checked to answer what it should
(allow or deny) before it is measured. Prints each run, then a table of
medians with the ratios to each floor.

    uv run python bench/extauthz/bench.py                   # 1 and 2 workers, 2 rounds
    uv run python bench/extauthz/bench.py --workers 1 --rounds 1 --duration 2
    uv run python bench/extauthz/bench.py --workers 1 --gateway-like 1000 --no-threads-case
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import struct
import sys
import time
from pathlib import Path

import grpc
import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from envoy.service.auth.v3 import attribute_context_pb2, external_auth_pb2, external_auth_pb2_grpc
from google.rpc import status_pb2

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import h2grpc, tracing_cases
from bench.h2grpc import BIN, Run, Target, asgi_noop, envoy_direct, h2_noop

METHOD = "/envoy.service.auth.v3.Authorization/Check"
SECRET = "bench-secret-0123456789abcdef-0123456789"
ALLOW = external_auth_pb2.CheckResponse(
    status=status_pb2.Status(code=0), ok_response=external_auth_pb2.OkHttpResponse()
).SerializeToString()


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


def expect_status(port: int, body: Path, code: int) -> None:
    """Sanity check before measuring: the case really is an allow (0) or deny (7)."""
    request = external_auth_pb2.CheckRequest.FromString(body.read_bytes()[5:])
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        response = external_auth_pb2_grpc.AuthorizationStub(channel).Check(request, timeout=5)
    if response.status.code != code:
        raise SystemExit(f"unexpected status {response.status.code} (wanted {code})")


def ours(
    config: Path, workers: int, server: str, threads: int = 1, extra: tuple[str, ...] = ()
) -> contextlib.AbstractContextManager[h2grpc.Server]:
    return h2grpc.listening(
        f"ours-{server}",
        [str(BIN / "extauthz"), "serve", "--config", str(config), "--workers", str(workers),
         "--server", server, "--envoy-threads", str(threads), *extra],
    )  # fmt: skip


def bench_workers(workers: int, workdir: Path, args: argparse.Namespace) -> list[Run]:
    """Every server up at once; the cases interleave for ``rounds``."""
    config, tokens = write_config(workdir, 10_000)
    bodies = {}
    for case, token in (("hs256", tokens["hs"]), ("denied", tokens["forged"])):
        bodies[case] = workdir / f"{case}.bin"
        bodies[case].write_bytes(grpc_frame(check_request(token, None).SerializeToString()))
    allow_frame = grpc_frame(ALLOW)
    print(f"workers={workers}", flush=True)
    with contextlib.ExitStack() as stack:
        direct = stack.enter_context(envoy_direct(workers, allow_frame, workdir))
        noop = stack.enter_context(asgi_noop(workers, allow_frame))
        h2noop = stack.enter_context(h2_noop(workers, allow_frame))
        envoy = stack.enter_context(ours(config, workers, "envoy"))
        h2 = stack.enter_context(ours(config, workers, "h2"))
        expect_status(envoy.port, bodies["hs256"], 0)
        expect_status(envoy.port, bodies["denied"], 7)
        expect_status(h2.port, bodies["hs256"], 0)
        expect_status(h2.port, bodies["denied"], 7)
        threaded = None
        if args.threads_case and workers == 1:
            # Threads instead of processes: one worker, two Envoy threads.
            threaded = stack.enter_context(ours(config, 1, "envoy", threads=2))
        targets = [
            *h2grpc.floors(direct, noop, METHOD, bodies["hs256"]),
            Target("hs256", envoy, METHOD, bodies["hs256"]),
            Target("denied", envoy, METHOD, bodies["denied"], latency=False),
            Target("hs256-h2", h2, METHOD, bodies["hs256"]),
            Target("h2-noop", h2noop, METHOD, bodies["hs256"]),
        ]
        if threaded is not None:
            targets.append(Target("hs256-2threads", threaded, METHOD, bodies["hs256"], False))
        if args.tracing:
            # Only the floors and hs256 off / 1% / 100% (issue 27's three cases).
            targets = [*targets[:4]]  # the floors and hs256
            sink = stack.enter_context(tracing_cases.receiver())
            for case, ratio in tracing_cases.RATIOS.items():
                extra = tuple(tracing_cases.flags(sink, ratio))
                server = stack.enter_context(ours(config, workers, "envoy", extra=extra))
                expect_status(server.port, bodies["hs256"], 0)
                targets.append(Target(f"hs256-{case}", server, METHOD, bodies["hs256"], False))
        results = h2grpc.rounds(targets, workers, args, workdir)
        if args.tracing:
            print(f"  {tracing_cases.exported(sink)}", flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    h2grpc.add_arguments(parser)
    parser.add_argument(
        "--threads-case",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="at 1 worker, also ours with 2 Envoy threads (threads vs processes)",
    )
    parser.add_argument(
        "--tracing",
        action="store_true",
        help="only the floors and hs256 with tracing off, at 1%% and at 100%% (issue 27)",
    )
    args = parser.parse_args()
    return h2grpc.run_bench(
        args, lambda workers, workdir: bench_workers(workers, workdir, args), "extauthz-bench-"
    )


if __name__ == "__main__":
    sys.exit(main())
