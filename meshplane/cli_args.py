"""The ``serve`` flags and start-up checks that ``extauthz`` and ``ratelimit`` share.

Both services run under :func:`meshplane.server.serve` and take their policy
either from ``--config`` or from the management plane, so their ``serve``
commands agree on how they listen, drain and get configured. Defining those
flags once keeps the two CLIs from drifting apart (a flag renamed or a
default changed in one only); each service adds its own flags after these.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meshplane import control_plane, tracing
from meshplane.logging import configure_logging
from meshplane.netaddr import check_serve_listen, parse_listen
from meshplane.server_contract import SERVER_KINDS, ServeOptions
from meshplane.tls import ListenerTlsFiles


def add_serve_arguments(
    parser: argparse.ArgumentParser, *, config_help: str, listen_default: str, workers_help: str
) -> None:
    """``--config``, ``--listen``, ``--workers``, ``--metrics-listen``,
    ``--grace-seconds``, ``--server``, ``--envoy-threads``, the ``--tls-*``
    flags and the ``--control-plane`` group."""
    parser.add_argument("--config", help=config_help)
    parser.add_argument("--listen", default=listen_default, help="gRPC HOST:PORT")
    parser.add_argument("--workers", type=int, default=1, help=workers_help)
    parser.add_argument("--metrics-listen", help="HOST:PORT for Prometheus /metrics")
    parser.add_argument("--grace-seconds", type=float, default=5.0, help="drain time on SIGTERM")
    parser.add_argument(
        "--server",
        choices=SERVER_KINDS,
        default="envoy",
        help="HTTP/2 server: envoy (Envoy + embedded Python, the default) "
        "or h2 (meshplane's own one-thread HTTP/2 server: least CPU a call)",
    )
    parser.add_argument(
        "--envoy-threads", type=int, default=1, help="Envoy worker threads per worker process"
    )
    parser.add_argument("--tls-cert", help="serve gRPC over TLS with this PEM certificate chain")
    parser.add_argument("--tls-key", help="the PEM private key of --tls-cert")
    parser.add_argument(
        "--tls-client-ca",
        help="require client certificates signed by this PEM CA (mutual TLS)",
    )
    control_plane.add_arguments(parser)
    tracing.add_arguments(parser)


def service_parser(
    prog: str, description: str, serve_help: str, **serve_arguments: str
) -> tuple[argparse.ArgumentParser, Any, argparse.ArgumentParser]:
    """(parser, its subcommands, the ``serve`` subcommand with the shared flags).

    ``serve_arguments`` are :func:`add_serve_arguments`'s keyword arguments.
    """
    parser = argparse.ArgumentParser(prog=prog, description=description)
    sub = parser.add_subparsers(dest="command", required=True)
    srv = sub.add_parser("serve", help=serve_help)
    add_serve_arguments(srv, **serve_arguments)
    return parser, sub, srv


def streamed_config(
    args: argparse.Namespace, service: str, loader: Callable[[Path], Any]
) -> control_plane.ControlPlaneOptions | None:
    """Under ``serve --control-plane``, start the subscriber and point
    ``args.config`` at the snapshot it keeps; None in static ``--config`` mode
    (and for other commands). Raises ConfigError for inconsistent flags."""
    if args.command != "serve":
        return None
    if args.control_plane:
        # The flag checks warn (plaintext stream) and the subscriber starts
        # before serve() sets up logging: make those lines JSON like the rest.
        configure_logging(service)
    streamed = control_plane.options_from(args, service)
    if streamed is not None:
        # Workers load the last good snapshot; the subscriber keeps it fresh.
        args.config = str(control_plane.start_subscriber(streamed, service, loader))
    return streamed


def serve_arguments_error(args: argparse.Namespace, *extra_listens: str | None) -> str | None:
    """The first problem with the shared serve flags (and ``extra_listens``), or None."""
    try:
        for listen in (args.metrics_listen, *extra_listens):
            if listen:
                parse_listen(listen)
    except ValueError as exc:
        return str(exc)
    if args.workers < 1:
        return "--workers must be at least 1"
    try:
        check_serve_listen(args.listen, args.workers)
    except ValueError as exc:
        return str(exc)
    if args.envoy_threads < 1:
        return "--envoy-threads must be at least 1"
    if bool(args.tls_cert) != bool(args.tls_key):
        return "--tls-cert and --tls-key go together"
    if args.tls_client_ca and not args.tls_cert:
        return "--tls-client-ca needs --tls-cert and --tls-key"
    tls = tls_files(args)
    if tls is not None:
        try:
            tls.check_readable()
        except OSError as exc:
            return f"cannot read a TLS file: {exc}"
    return None


def tls_files(args: argparse.Namespace) -> ListenerTlsFiles | None:
    if not args.tls_cert:
        return None
    return ListenerTlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca).absolute()


def serve_options(args: argparse.Namespace, http_listen: str | None = None) -> ServeOptions:
    return ServeOptions(
        listen=args.listen,
        workers=args.workers,
        metrics_listen=args.metrics_listen,
        http_listen=http_listen,
        grace_seconds=args.grace_seconds,
        server=args.server,
        tls=tls_files(args),
        envoy_threads=args.envoy_threads,
    )


def fail(service: str, message: str) -> int:
    """Print ``SERVICE: error: MESSAGE`` like argparse does, and return exit code 2."""
    print(f"{service}: error: {message}", file=sys.stderr)
    return 2
