"""``mgmt-api serve``: run the management API on uvicorn.

uvicorn handles SIGTERM/SIGINT: it stops accepting, finishes in-flight
requests and runs the shutdown hook that closes the store's pool.
"""

from __future__ import annotations

import dataclasses
import errno
import gc
import logging
import signal
import socket
import ssl
from typing import Annotated

import typer
import uvicorn
from fastapi import FastAPI

from meshplane.logging import configure_logging
from meshplane.netaddr import is_loopback_host
from meshplane.tls import ReloadingServerContext, tls_files_from
from mgmt_api.app import create_app
from mgmt_api.domain.client_address import parse_forwarded_header, parse_trusted_proxies
from mgmt_api.domain.replicas import plain_hop
from mgmt_api.settings import DEFAULT_GRPC_LISTEN, DEFAULT_LISTEN, Settings

log = logging.getLogger(__name__)
app = typer.Typer(add_completion=False, help="meshplane management API")


def _split_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise typer.BadParameter(f"expected HOST:PORT, got {listen!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


# The command-line options of `serve`, one alias each so its signature reads at once.
_ListenOption = Annotated[str, typer.Option(help="HOST:PORT to listen on")]
_DatabaseOption = Annotated[
    str | None,
    typer.Option(
        help=(
            "SQLAlchemy URL (postgresql+psycopg://...); "
            "default: SQLite in $MESHPLANE_DATA_DIR or ./.data"
        )
    ),
]
_PublicUrlOption = Annotated[
    str | None, typer.Option(help="Address agents use to reach this server (install templates)")
]
_GrpcListenOption = Annotated[
    str,
    typer.Option(
        help="HOST:PORT of the PolicyDistribution gRPC server (port 0: any free port); "
        "'off' disables it"
    ),
]
_ConfigOption = Annotated[
    str | None,
    typer.Option(
        help="Install config YAML with spec.identityProvider (OIDC login, directory sync); "
        "default: $MESHPLANE_CONFIG"
    ),
]
_GrpcTlsCertOption = Annotated[
    str | None,
    typer.Option(help="PEM certificate of the policy stream; default: $MESHPLANE_GRPC_TLS_CERT"),
]
_GrpcTlsKeyOption = Annotated[
    str | None,
    typer.Option(help="PEM private key of the policy stream; default: $MESHPLANE_GRPC_TLS_KEY"),
]
_GrpcTlsClientCaOption = Annotated[
    str | None,
    typer.Option(
        help="PEM CA that subscribers' client certificates must chain to (mTLS); "
        "default: $MESHPLANE_GRPC_TLS_CLIENT_CA"
    ),
]
_TlsCertOption = Annotated[
    str | None,
    typer.Option(
        help="PEM certificate chain of the REST port (HTTPS); default: $MESHPLANE_TLS_CERT"
    ),
]
_TlsKeyOption = Annotated[
    str | None,
    typer.Option(help="PEM private key of the REST port; default: $MESHPLANE_TLS_KEY"),
]
_TlsClientCaOption = Annotated[
    str | None,
    typer.Option(
        help="PEM CA that REST clients' certificates must chain to (mTLS); "
        "default: $MESHPLANE_TLS_CLIENT_CA"
    ),
]
_TrustedProxiesOption = Annotated[
    str | None,
    typer.Option(
        help="Addresses/CIDRs of proxies whose X-Forwarded-For/Forwarded name the client "
        "(login throttling); default: $MESHPLANE_TRUSTED_PROXIES, else none"
    ),
]
_ForwardedHeaderOption = Annotated[
    str | None,
    typer.Option(
        help="The header the trusted proxies append to: x-forwarded-for or forwarded "
        "(RFC 7239); default: $MESHPLANE_FORWARDED_HEADER, else x-forwarded-for"
    ),
]


@app.command()
def serve(  # noqa: PLR0917 - one parameter per command-line option, as typer wants
    listen: _ListenOption = DEFAULT_LISTEN,
    database: _DatabaseOption = None,
    public_url: _PublicUrlOption = None,
    grpc_listen: _GrpcListenOption = DEFAULT_GRPC_LISTEN,
    config: _ConfigOption = None,
    grpc_tls_cert: _GrpcTlsCertOption = None,
    grpc_tls_key: _GrpcTlsKeyOption = None,
    grpc_tls_client_ca: _GrpcTlsClientCaOption = None,
    tls_cert: _TlsCertOption = None,
    tls_key: _TlsKeyOption = None,
    tls_client_ca: _TlsClientCaOption = None,
    trusted_proxies: _TrustedProxiesOption = None,
    forwarded_header: _ForwardedHeaderOption = None,
) -> None:
    """Migrate the store, bootstrap it on first start, and serve /v2 (and the console, /ui/)."""
    configure_logging("mgmt-api")
    settings = Settings()
    if database:
        settings = dataclasses.replace(settings, database_url=database)
    if public_url:
        settings = dataclasses.replace(settings, public_url=public_url)
    if settings.grpc_listen is None and grpc_listen != "off":
        _split_listen(grpc_listen)
        settings = dataclasses.replace(settings, grpc_listen=grpc_listen)
    if config:
        settings = dataclasses.replace(settings, install_config=config)
    settings = dataclasses.replace(
        settings,
        grpc_tls_cert=grpc_tls_cert or settings.grpc_tls_cert,
        grpc_tls_key=grpc_tls_key or settings.grpc_tls_key,
        grpc_tls_client_ca=grpc_tls_client_ca or settings.grpc_tls_client_ca,
        tls_cert=tls_cert or settings.tls_cert,
        tls_key=tls_key or settings.tls_key,
        tls_client_ca=tls_client_ca or settings.tls_client_ca,
        trusted_proxies=settings.trusted_proxies if trusted_proxies is None else trusted_proxies,
        forwarded_header=forwarded_header or settings.forwarded_header,
    )
    _check_client_address(settings)
    host, port = _split_listen(listen)
    # Before the migrations: a taken port fails in a second, naming its flag.
    _check_port_free(host, port, "--listen")
    if settings.grpc_listen is not None:
        _check_port_free(*_split_listen(settings.grpc_listen), "--grpc-listen")
    try:
        https = rest_tls(settings, host)
    except (ValueError, OSError, ssl.SSLError) as exc:
        raise typer.BadParameter(str(exc)) from None
    if settings.replica_secret and not settings.replica_address:
        settings = dataclasses.replace(
            settings, replica_address=replica_address(host, port, https is not None)
        )
    if settings.replica_secret and plain_hop(settings.replica_address or ""):
        raise typer.BadParameter(
            f"{settings.replica_address} is plain HTTP off this machine; the hop between "
            "replicas carries the agents' answers: serve REST over TLS (--tls-cert) or give "
            "an https:// address",
            param_hint="MESHPLANE_REPLICA_ADDRESS",
        )
    _run(create_app(settings), host, port, https)


def _check_client_address(settings: Settings) -> None:
    """Refuse bad client-address settings at start, naming the option."""
    try:
        parse_trusted_proxies(settings.trusted_proxies)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--trusted-proxies") from None
    try:
        parse_forwarded_header(settings.forwarded_header)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--forwarded-header") from None


def _check_port_free(host: str, port: int, flag: str) -> None:
    """Refuse a port another process listens on, naming it and its flag.

    A probe bind (with SO_REUSEADDR and without SO_REUSEPORT, as both servers
    bind) only gives the clear message early; the servers' own binds are the
    guarantee (the gRPC server's port reuse is off, mgmt_api.distribution.hub).
    """
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                message = (
                    f"port {port} on {host} is in use (another mgmt-api?): stop what listens"
                    f" there or pass {flag} HOST:PORT with a free port"
                )
            else:
                message = f"cannot listen on {host}:{port}: {exc.strerror}"
            raise typer.BadParameter(message, param_hint=flag) from None


def _run(application: FastAPI, host: str, port: int, https: ReloadingServerContext | None) -> None:
    """Serve until SIGTERM/SIGINT, then drain and exit 0."""
    # Everything built so far (routes, models, compiled statements) lives for
    # the whole process: move it out of the collector's sight so full
    # collections stay short and do not show up as latency spikes.
    gc.collect()
    gc.freeze()
    # uvicorn drains on SIGTERM/SIGINT, then re-raises the signal to whatever
    # handler was installed before it: make that a plain exit 0, so a clean
    # drain reads as success (as ratelimit and extauthz exit), not as "killed".
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _exit_after_drain)
    uvicorn.run(
        application,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=10,
        proxy_headers=False,
        ssl_context_factory=None if https is None else (lambda _config, _default: https),
    )


def replica_address(host: str, port: int, https: bool) -> str:
    """Where the other replicas reach this one's REST port, by default: the listen
    address, or this host's name when it listens on every address."""
    if host in {"", "0.0.0.0", "::", "[::]"}:
        host = socket.gethostname()
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{'https' if https else 'http'}://{host}:{port}"


def rest_tls(settings: Settings, host: str) -> ReloadingServerContext | None:
    """The REST port's TLS context (reloading its files), or None for plain HTTP.

    Plain HTTP off loopback is served (TLS may end at a proxy in front) but
    warned about: Basic credentials, bearer tokens and console cookies would
    otherwise cross the network in clear.
    """
    files = tls_files_from(
        settings.tls_cert, settings.tls_key, settings.tls_client_ca, env_prefix="MESHPLANE_TLS"
    )
    if files is None:
        if not is_loopback_host(host):
            log.warning(
                "the REST port serves plain HTTP on a non-loopback address: credentials and "
                "console cookies cross the network in clear unless a TLS proxy is in front; "
                "set MESHPLANE_TLS_CERT and MESHPLANE_TLS_KEY (or --tls-cert/--tls-key)",
                extra={"address": host},
            )
        return None
    context = ReloadingServerContext(files, listener="REST port")
    log.info("REST port serves HTTPS", extra={"tls": files.mode})
    return context


def _exit_after_drain(_signum: int, _frame: object) -> None:
    raise SystemExit(0)


@app.callback()
def _root() -> None:
    """meshplane management API."""


def main() -> None:
    app()


if __name__ == "__main__":
    main()
