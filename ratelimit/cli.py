"""``ratelimit`` command line: ``serve`` and ``check``.

``ratelimit serve --config PATH [--listen HOST:PORT] [--workers N]
[--redis-url URL] [--metrics-listen HOST:PORT] [--settings FILE] ...``

The config (and settings) are validated in the supervisor before any worker
starts, so a bad file stops the process at once with ``FILE:LINE: field:
message`` and exit code 2, instead of workers dying one after another.
The Redis URL comes from ``--redis-url``, else ``$REDIS_URL``, else the file
named by ``--redis-url-file`` / ``$REDIS_URL_FILE`` (a mounted Secret).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from dataclasses import replace
from pathlib import Path

from meshplane import cli_args, control_plane, decision_log, tracing
from meshplane.config_error import ConfigError
from meshplane.server import serve
from ratelimit.app import AppOptions, build_app, load_snapshot
from ratelimit.config import load_config
from ratelimit.redis_url import RedisUrlError, parse_redis_url
from ratelimit.settings import FAILURE_MODES, Settings, load_settings

SERVICE = "ratelimit"


def _parser() -> argparse.ArgumentParser:
    parser, sub, srv = cli_args.service_parser(
        SERVICE,
        "Envoy global rate-limit service",
        "serve envoy.service.ratelimit.v3.RateLimitService",
        config_help="YAML file or directory of YAML files",
        listen_default="127.0.0.1:8081",
        workers_help="worker processes (needs Redis if >1)",
    )
    srv.add_argument("--redis-url", help="Redis URL (else $REDIS_URL, else --redis-url-file)")
    srv.add_argument("--redis-url-file", help="file holding the Redis URL (else $REDIS_URL_FILE)")
    srv.add_argument("--settings", help="service settings YAML (failureMode, headers, ...)")
    srv.add_argument("--failure-mode", choices=FAILURE_MODES, help="when Redis cannot answer")
    srv.add_argument("--store-timeout-ms", type=float, help="how long a decision waits for Redis")
    srv.add_argument("--no-headers", action="store_true", help="do not add x-ratelimit-* headers")
    srv.add_argument(
        "--quota-mode",
        action="store_true",
        help="every descriptor in quota mode (envoyproxy/ratelimit's QUOTA_MODE)",
    )
    decision_log.add_arguments(srv, values_noun="descriptor values")
    chk = sub.add_parser("check", help="validate a config (and settings) and exit")
    chk.add_argument("--config", required=True)
    chk.add_argument("--settings")
    return parser


def resolve_redis_url(flag: str | None, flag_file: str | None) -> str | None:
    """``--redis-url``, ``$REDIS_URL``, then the URL file; empty means none."""
    url = flag or os.environ.get("REDIS_URL")
    if url:
        return url.strip()
    path = flag_file or os.environ.get("REDIS_URL_FILE")
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(
                f"cannot read the Redis URL file: {exc.strerror}", source=path
            ) from exc
        return text or None
    return None


def _settings(args: argparse.Namespace) -> Settings:
    settings = load_settings(Path(args.settings)) if args.settings else Settings()
    if getattr(args, "failure_mode", None):
        settings = replace(settings, failure_mode=args.failure_mode)
    if getattr(args, "store_timeout_ms", None) is not None:
        if args.store_timeout_ms <= 0:
            raise ConfigError("must be positive", field="--store-timeout-ms")
        settings = replace(settings, store_timeout=args.store_timeout_ms / 1000)
    if getattr(args, "no_headers", False):
        settings = replace(settings, headers_enabled=False)
    if getattr(args, "quota_mode", False):
        settings = replace(settings, quota_mode=True)
    return settings


def _fail(message: str) -> int:
    return cli_args.fail(SERVICE, message)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = _settings(args)
        # load_snapshot also validates the cluster switches: a bad one is NACKed.
        streamed = cli_args.streamed_config(args, SERVICE, load_snapshot)
        config = load_config(Path(args.config))
    except ConfigError as exc:
        return _fail(str(exc))
    if args.command == "check":
        print(f"ok: {len(config.domains)} domain(s): {', '.join(sorted(config.domains))}")
        return 0
    try:
        redis_url = resolve_redis_url(args.redis_url, args.redis_url_file)
        if redis_url:
            parse_redis_url(redis_url)
    except (ConfigError, RedisUrlError) as exc:
        return _fail(str(exc))
    problem = cli_args.serve_arguments_error(args)
    if problem:
        return _fail(problem)
    if args.workers > 1 and not redis_url:
        return _fail(
            "--workers > 1 needs Redis: in-memory counters are per process, so N workers "
            "would admit N times the limit"
        )
    try:
        decisions = decision_log.settings_from_args(args, settings.decision_log)
        trace_settings = tracing.settings_from_args(args, os.environ, SERVICE)
    except (ValueError, ConfigError) as exc:
        return _fail(str(exc))
    options = AppOptions(
        config_path=args.config,
        redis_url=redis_url,
        settings=settings,
        decision_log=decisions,
        tracing=trace_settings,
    )
    if streamed is not None:
        options = replace(options, reload_interval=control_plane.RELOAD_INTERVAL)
    return serve(
        functools.partial(build_app, options),
        cli_args.serve_options(args),
        service=SERVICE,
    )


if __name__ == "__main__":
    sys.exit(main())
