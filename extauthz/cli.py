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
import sys
import time
import warnings
from pathlib import Path

import grpc
import jwt
from envoy.service.auth.v3 import attribute_context_pb2, external_auth_pb2, external_auth_pb2_grpc

from extauthz.app import make_app
from extauthz.config import POLICY_CONTEXT_KEY, ExtAuthzConfig, load_config
from extauthz.keys import KeyFamily
from meshplane import control_plane
from meshplane.config_error import ConfigError
from meshplane.netaddr import parse_listen
from meshplane.server import ServeOptions, serve

SERVICE = "extauthz"
DEMO_SECRET = "secret"  # noqa: S105 - the public TSB demo secret, for `token` only


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="extauthz", description="Envoy ext_authz (gRPC Check and HTTP) JWT policy server"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    srv = sub.add_parser("serve", help="serve envoy.service.auth.v3.Authorization/Check")
    srv.add_argument("--config", help="policy YAML file (reloaded on change)")
    srv.add_argument("--listen", default="0.0.0.0:9191", help="gRPC HOST:PORT")
    srv.add_argument("--workers", type=int, default=1, help="worker processes (SO_REUSEPORT)")
    srv.add_argument("--metrics-listen", help="HOST:PORT for Prometheus /metrics")
    srv.add_argument("--http-listen", help="HOST:PORT for Envoy's http_service mode")
    srv.add_argument("--grace-seconds", type=float, default=5.0, help="drain time on SIGTERM")
    control_plane.add_arguments(srv)
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
    headers = {":method": args.method, ":path": args.path}
    for item in args.header:
        name, sep, value = item.partition("=")
        if not sep:
            return _fail(f"--header {item!r} is not NAME=VALUE")
        headers[name.strip().lower()] = value
    http = attribute_context_pb2.AttributeContext.HttpRequest(
        method=args.method, path=args.path, protocol="HTTP/1.1", headers=headers
    )
    attributes = attribute_context_pb2.AttributeContext(
        request=attribute_context_pb2.AttributeContext.Request(http=http)
    )
    if args.policy:
        attributes.context_extensions[POLICY_CONTEXT_KEY] = args.policy
    request = external_auth_pb2.CheckRequest(attributes=attributes)
    with grpc.insecure_channel(args.server) as channel:
        stub = external_auth_pb2_grpc.AuthorizationStub(channel)
        try:
            response = stub.Check(request, timeout=5)
        except grpc.RpcError as exc:
            return _fail(f"Check failed: {exc.code().name}")
    allowed = response.status.code == 0
    result: dict[str, object] = {"allowed": allowed, "grpc_status": response.status.code}
    if allowed:
        ok = response.ok_response
        result["headers"] = {h.header.key: h.header.value for h in ok.headers}
        result["headers_to_remove"] = list(ok.headers_to_remove)
    else:
        denied = response.denied_response
        result["http_status"] = denied.status.code
        result["headers"] = {h.header.key: h.header.value for h in denied.headers}
        result["body"] = denied.body
    print(json.dumps(result, indent=2))
    return 0 if allowed else 1


def _fail(message: str) -> int:
    print(f"extauthz: error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "token":
            return _token(args)
        if args.command == "check" and args.server:
            return _send_check(args)
        streamed = control_plane.options_from(args, SERVICE) if args.command == "serve" else None
        if streamed is not None:
            # Workers load the last good snapshot; the subscriber keeps it fresh.
            args.config = str(control_plane.start_subscriber(streamed, SERVICE, load_config))
        config = load_config(Path(args.config))
    except ConfigError as exc:
        return _fail(str(exc))
    if args.command == "check":
        summary = {"defaultPolicy": config.default_policy, "policies": sorted(config.policies)}
        print("ok: " + json.dumps(summary))
        return 0
    try:
        for listen in (args.listen, args.metrics_listen, args.http_listen):
            if listen:
                parse_listen(listen)
    except ValueError as exc:
        return _fail(str(exc))
    if args.workers < 1:
        return _fail("--workers must be at least 1")
    return serve(
        functools.partial(
            make_app,
            # Not resolved under --control-plane: ``current`` is a symlink that
            # is swapped on every snapshot, and resolving it would pin one.
            str(Path(args.config).absolute() if streamed else Path(args.config).resolve()),
            control_plane.RELOAD_INTERVAL if streamed is not None else 1.0,
        ),
        ServeOptions(
            listen=args.listen,
            workers=args.workers,
            metrics_listen=args.metrics_listen,
            http_listen=args.http_listen,
            grace_seconds=args.grace_seconds,
        ),
        service=SERVICE,
    )


if __name__ == "__main__":
    sys.exit(main())
