"""``meshplane-injector``: the sidecar injection webhook.

    meshplane-injector serve --listen 0.0.0.0:9443 --tls-cert FILE --tls-key FILE \\
        --client-ca FILE [--client-name NAME ...] --config FILE \\
        [--metrics-listen 127.0.0.1:9106]

The injected container runs ``meshplane-sidecar-agent`` (:mod:`sidecar_agent`).

``serve`` answers ``POST /mutate``, ``GET /healthz`` and ``GET /readyz`` over
HTTPS (the certificate files are re-read when they change) to the API server
only: the handshake requires a client certificate that ``--client-ca`` signs
(and, with ``--client-name``, that names one of them), so nothing else gets
a patch (it says which Secrets and images a pod runs with). ``/metrics``,
``/healthz`` and ``/readyz`` are also served over plain HTTP on the metrics
listener, for the kubelet's probes, which present no certificate.
``--insecure-no-client-auth`` serves anyone, for a test bench only.

SIGTERM drains: ``/readyz`` turns 503, the listeners stop accepting, reviews
in progress are answered, then the process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST

from injector import config as config_mod
from injector import review
from injector.http import HttpServer, Request, Response, Route
from injector.metrics import InjectorMetrics
from injector.webhook import Webhook
from meshplane.cli_args import fail
from meshplane.config_error import ConfigError
from meshplane.logging import configure_logging
from meshplane.netaddr import parse_listen
from meshplane.tls import ListenerTlsFiles, ReloadingServerContext

log = logging.getLogger("injector")

SERVICE = "meshplane-injector"
GRACE_SECONDS = 5.0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=SERVICE, description="meshplane's sidecar injection webhook (docs/injector.md)."
    )
    sub = p.add_subparsers(dest="command", required=True)
    srv = sub.add_parser("serve", help="serve the mutating admission webhook")
    srv.add_argument(
        "--listen", default="0.0.0.0:9443", help="HTTPS HOST:PORT (default 0.0.0.0:9443)"
    )
    srv.add_argument("--tls-cert", required=True, help="PEM certificate chain (re-read on change)")
    srv.add_argument("--tls-key", required=True, help="PEM private key of --tls-cert")
    srv.add_argument(
        "--client-ca",
        help="PEM CA bundle the API server's client certificate chains to (re-read on change)",
    )
    srv.add_argument(
        "--client-name",
        action="append",
        default=[],
        metavar="NAME",
        help="accept only a client certificate with this subject CN or DNS name (repeatable; "
        "default: any certificate --client-ca signs)",
    )
    srv.add_argument(
        "--insecure-no-client-auth",
        action="store_true",
        help="serve clients without a certificate (a test bench only: anyone gets patches)",
    )
    srv.add_argument("--config", required=True, help="the injector's YAML configuration")
    srv.add_argument(
        "--metrics-listen", default="127.0.0.1:9106", help="plain HTTP /metrics HOST:PORT"
    )
    return p


class Service:
    """The two listeners and the webhook, wired."""

    def __init__(
        self,
        webhook: Webhook,
        tls: ReloadingServerContext,
        client_names: frozenset[str] = frozenset(),
    ) -> None:
        self.webhook = webhook
        self.tls = tls
        self.ready = False
        health = {
            "/healthz": Route("GET", lambda _r: Response.text(200, "ok")),
            "/readyz": Route("GET", self._readyz),
        }
        self.https = HttpServer(
            "webhook",
            {
                "/mutate": Route("POST", self._mutate),
                **health,
            },
            max_body=review.MAX_REVIEW_BYTES,
            tls=tls,
            on_refused=self._refused,
            client_allowed=(lambda names: bool(names & client_names)) if client_names else None,
        )
        self.metrics = HttpServer(
            "metrics", {"/metrics": Route("GET", self._metrics), **health}, max_body=0
        )

    def _mutate(self, request: Request) -> Response:
        status, doc = self.webhook.mutate(request.body, request.headers.get("content-type"))
        return Response.json(status, doc)

    def _refused(self, path: str, status: int) -> None:
        """A /mutate request the HTTP layer refused (too large, chunked...) is a refused review."""
        if path == "/mutate":
            self.webhook.metrics.reviews.labels("refused", f"http-{status}").inc()

    def _readyz(self, _request: Request) -> Response:
        return Response.text(200, "ok") if self.ready else Response.text(503, "draining")

    def _metrics(self, _request: Request) -> Response:
        self.webhook.metrics.tls_reloads.set(self.tls.reloads)
        return Response(200, CONTENT_TYPE_LATEST, self.webhook.metrics.render())

    async def run(self, listen: str, metrics_listen: str) -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        port = await self.https.start(*parse_listen(listen))
        metrics_port = await self.metrics.start(*parse_listen(metrics_listen))
        self.ready = True
        log.info(
            "injector started",
            extra={
                "port": port,
                "metrics_port": metrics_port,
                "cluster": self.webhook.config.cluster_ref,
            },
        )
        await stop.wait()
        self.ready = False
        log.info("draining")
        await self.https.drain(GRACE_SECONDS)
        await self.metrics.drain(0.5)
        log.info("injector stopped")
        return 0


def client_ca(args: argparse.Namespace) -> str | None:
    """The client CA file, or None when client certificates are (explicitly) not asked for."""
    if args.insecure_no_client_auth:
        if args.client_ca or args.client_name:
            raise ConfigError(
                "--insecure-no-client-auth cannot go with --client-ca or --client-name",
                field="--insecure-no-client-auth",
            )
        log.warning("serving without client certificates: anyone who reaches the port gets patches")
        return None
    if not args.client_ca:
        raise ConfigError(
            "the API server's client CA is required (only it may ask for a patch); "
            "--insecure-no-client-auth serves anyone, for a test bench only",
            field="--client-ca",
        )
    return str(args.client_ca)


def serve(args: argparse.Namespace) -> int:
    parse_listen(args.listen)
    parse_listen(args.metrics_listen)
    config = config_mod.load(Path(args.config))
    ca_pem = config_mod.read_ca(config)
    files = ListenerTlsFiles(args.tls_cert, args.tls_key, client_ca(args)).absolute()
    try:
        tls = ReloadingServerContext(files, listener="webhook")
    except (OSError, ValueError) as exc:
        raise ConfigError(str(exc), field="--tls-cert") from None
    names = frozenset(args.client_name)
    service = Service(Webhook(config, ca_pem, InjectorMetrics()), tls, names)
    return asyncio.run(service.run(args.listen, args.metrics_listen))


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    configure_logging(SERVICE)
    try:
        return serve(args)
    except (ConfigError, ValueError) as exc:
        return fail(SERVICE, str(exc))


if __name__ == "__main__":
    sys.exit(main())
