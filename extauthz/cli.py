"""``extauthz`` command line: ``serve``, ``check`` and ``token``.

``extauthz serve --config FILE [--listen HOST:PORT] [--workers N]
[--metrics-listen HOST:PORT] [--http-listen HOST:PORT] [--grace-seconds S]``

The config is validated in the supervisor before any worker starts, so a bad
file stops the process at once with ``FILE:LINE: field: message`` and exit
code 2 instead of workers dying one after another.

``extauthz check --config FILE`` validates a policy file and exits;
``extauthz check --server HOST:PORT --path P [--header k=v]...`` sends one
Check over gRPC with the official Envoy protos, as Envoy would, and prints
the decision (exit 0 allowed, 1 denied).

``extauthz token [--config FILE [--policy NAME]] [--secret S] --path P`` mints a
demo HS256 token whose path claim grants ``P``, signed with the policy's
first HMAC secret (or ``--secret``). It is for the README's tour: never use
a shared demo secret in production.
"""

from __future__ import annotations

import argparse
import base64
import functools
import json
import os
import sys
import time
import warnings
from pathlib import Path

import grpc
import jwt
from envoy.service.auth.v3 import external_auth_pb2_grpc

from extauthz.app import make_app
from extauthz.config import POLICY_CONTEXT_KEY, ExtAuthzConfig, load_config
from extauthz.keys import KeyFamily
from meshplane import cli_args, control_plane, decision_log, tracing
from meshplane.check_request import (
    HttpCall,
    PairError,
    build_check_request,
    describe_check_response,
    parse_pairs,
)
from meshplane.config_error import ConfigError
from meshplane.server import serve

SERVICE = "extauthz"
DEMO_SECRET = "secret"  # noqa: S105 - the public TSB demo secret, for `token` only


def _parser() -> argparse.ArgumentParser:
    parser, sub, srv = cli_args.service_parser(
        SERVICE,
        "Envoy ext_authz (gRPC Check and HTTP) JWT policy server",
        "serve envoy.service.auth.v3.Authorization/Check",
        config_help="policy YAML file (reloaded on change)",
        listen_default="127.0.0.1:9191",
        workers_help="worker processes (SO_REUSEPORT)",
    )
    srv.add_argument("--http-listen", help="HOST:PORT for Envoy's http_service mode")
    decision_log.add_arguments(srv, values_noun="the principal (the token's sub)")
    chk = sub.add_parser("check", help="validate a policy file, or send one Check to a server")
    target = chk.add_mutually_exclusive_group(required=True)
    target.add_argument("--config", help="validate this policy file and exit")
    target.add_argument("--server", help="send a Check to this gRPC HOST:PORT")
    chk.add_argument("--path", default="/", help="request path (with --server)")
    chk.add_argument("--method", default="GET", help="request method (with --server)")
    chk.add_argument(
        "--header", action="append", default=[], help="request header NAME=VALUE (repeatable)"
    )
    chk.add_argument("--policy", help=f"context extension {POLICY_CONTEXT_KEY} (with --server)")
    tok = sub.add_parser("token", help="mint a demo HS256 token with a path claim")
    tok.add_argument("--config", help="take the secret and claim name from this policy file")
    tok.add_argument("--policy", help="policy in --config (default: defaultPolicy)")
    tok.add_argument("--secret", help="HMAC secret (default: the policy's, else 'secret')")
    tok.add_argument("--path", default="/headers", help="path prefix to grant")
    tok.add_argument("--ttl", type=int, default=3600, help="seconds until exp")
    tok.add_argument("--claim-name", help="path claim name (default: the policy's, else 'path')")
    tok.add_argument("--kid", help="kid header")
    return parser


def mint_demo_token(
    secret: bytes | str, path: str, ttl: int, *, claim: str = "path", kid: str | None = None
) -> str:
    """An HS256 token whose path claim is ``base64(path)``, valid from now on."""
    now = int(time.time())
    payload = {claim: base64.b64encode(path.encode()).decode(), "nbf": now, "exp": now + ttl}
    headers = {"kid": kid} if kid else None
    with warnings.catch_warnings():
        # The demo secret is short on purpose (TSB parity); the warning would
        # only clutter the README's copy-paste output.
        warnings.simplefilter("ignore")
        return jwt.encode(payload, secret, algorithm="HS256", headers=headers)


def _token_settings(
    config: ExtAuthzConfig, policy_name: str | None
) -> tuple[bytes, str, str | None]:
    """The first HMAC secret, path claim name and kid of a policy."""
    name = policy_name or config.default_policy
    policy = config.policies.get(name)
    if policy is None:
        raise ConfigError(f"no policy named {name!r}", source=config.source, field="--policy")
    for key in policy.jwt.static_keys:
        if key.family is KeyFamily.HMAC and "HS256" in policy.jwt.algorithms:
            claim = policy.path_claim.name if policy.path_claim else "path"
            return bytes(key.material), claim, key.kid
    raise ConfigError(
        f"policy {name!r} has no HMAC secret usable with HS256; pass --secret",
        source=config.source,
        field="--policy",
    )


def _token(args: argparse.Namespace) -> int:
    secret: bytes | str = DEMO_SECRET
    claim, kid = "path", args.kid
    if args.config:
        secret, claim, config_kid = _token_settings(load_config(Path(args.config)), args.policy)
        kid = kid or config_kid
    if args.secret:
        secret = args.secret
    token = mint_demo_token(secret, args.path, args.ttl, claim=args.claim_name or claim, kid=kid)
    print(token)
    return 0


def _send_check(args: argparse.Namespace) -> int:
    try:
        headers = parse_pairs(args.header, "--header", lower=True)
    except PairError as exc:
        return _fail(str(exc))
    extensions = {POLICY_CONTEXT_KEY: args.policy} if args.policy else {}
    call = HttpCall(
        method=args.method, path=args.path, headers=headers, context_extensions=extensions
    )
    with grpc.insecure_channel(args.server) as channel:
        stub = external_auth_pb2_grpc.AuthorizationStub(channel)
        try:
            response = stub.Check(build_check_request(call), timeout=5)
        except grpc.RpcError as exc:
            return _fail(f"Check failed: {exc.code().name}")
    result = describe_check_response(response)
    print(json.dumps(result, indent=2))
    return 0 if result["allowed"] else 1


def _fail(message: str) -> int:
    return cli_args.fail(SERVICE, message)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "token":
            return _token(args)
        if args.command == "check" and args.server:
            return _send_check(args)
        streamed = cli_args.streamed_config(args, SERVICE, load_config)
        config = load_config(Path(args.config))
    except ConfigError as exc:
        return _fail(str(exc))
    if args.command == "check":
        summary = {"defaultPolicy": config.default_policy, "policies": sorted(config.policies)}
        print("ok: " + json.dumps(summary))
        return 0
    try:
        trace_settings = tracing.settings_from_args(args, os.environ, SERVICE)
    except ConfigError as exc:
        return _fail(str(exc))
    problem = cli_args.serve_arguments_error(args, args.http_listen)
    if problem:
        return _fail(problem)
    try:
        decisions = decision_log.settings_from_args(args)
    except ValueError as exc:
        return _fail(str(exc))
    return serve(
        functools.partial(
            make_app,
            # Not resolved under --control-plane: ``current`` is a symlink that
            # is swapped on every snapshot, and resolving it would pin one.
            str(Path(args.config).absolute() if streamed else Path(args.config).resolve()),
            control_plane.RELOAD_INTERVAL if streamed is not None else 1.0,
            decisions,
            trace_settings,
        ),
        cli_args.serve_options(args, http_listen=args.http_listen),
        service=SERVICE,
    )


if __name__ == "__main__":
    sys.exit(main())
