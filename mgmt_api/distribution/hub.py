"""The distribution plane inside ``mgmt-api serve``: gRPC server, feed, status.

It runs in the same event loop as the REST app (started and stopped by the
FastAPI lifespan), so a committed REST write reaches the open snapshot
streams without any broker: the write's worker thread hands the new store
revision to :meth:`Distribution.committed`, which wakes the
:class:`~mgmt_api.distribution.feed.ChangeFeed` on the loop. Writes made by
other replicas are picked up by the feed's store poll.

Snapshots carry inline key material (HMAC secrets of ExtAuthzPolicies), so
the stream is meant to run over TLS: :class:`DistributionTls` (settings
``MESHPLANE_GRPC_TLS_CERT`` / ``_KEY``, and ``_CLIENT_CA`` to also require a
client certificate) serves it with a server certificate; without it the
server logs a warning when it listens on anything but loopback. HTTP/2
keepalive pings (:data:`SERVER_OPTIONS`) close connections whose peer is
gone, so a half-open subscriber does not look connected forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import grpc
from sqlalchemy.engine import Engine

from meshplane.distribution_client import NodeIdentity
from meshplane.netaddr import is_loopback_host
from meshplane.proto.distribution.v1 import distribution_pb2_grpc as pb_grpc
from meshplane.tls import read_pem, tls_files_from
from mgmt_api.distribution.feed import ChangeFeed
from mgmt_api.distribution.registry import DEFAULT_STALE_AFTER_SECONDS, SubscriberRegistry
from mgmt_api.distribution.selection import cluster_fqn
from mgmt_api.distribution.server import KINDS, DistributionServicer
from mgmt_api.distribution.store_backend import StoreBackend
from mgmt_api.domain.durations import parse_duration
from mgmt_api.settings import Settings
from mgmt_api.store import repo
from mgmt_api.store.engine import read_tx

log = logging.getLogger(__name__)

STORE_POLL_SECONDS = 1.0
# How long a stream may go without a store change before it re-checks its
# credentials (a revoked key, a deleted cluster); also bounds how long a
# revocation written by another replica takes to close it.
REVALIDATE_SECONDS = 5.0
# Ping idle connections every 30 s and drop them when a ping is not answered
# within 10 s; accept the subscribers' own pings (every 20 s) even while no
# call carries data, and never give up pinging a quiet stream.
SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
)


@dataclass(frozen=True)
class DistributionTls:
    """Server certificate and key (PEM), and optionally the CA that client certificates
    must chain to (mutual TLS: a subscriber then needs a certificate *and* its token)."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None

    def server_credentials(self) -> grpc.ServerCredentials:
        """Read the files now; an unreadable one stops the start, naming it."""
        listener = "policy stream"
        key, cert = (
            read_pem(self.key_file, "key", listener),
            read_pem(self.cert_file, "certificate", listener),
        )
        if self.client_ca_file:
            return grpc.ssl_server_credentials(
                [(key, cert)],
                root_certificates=read_pem(self.client_ca_file, "client CA", listener),
                require_client_auth=True,
            )
        return grpc.ssl_server_credentials([(key, cert)])


def tls_from(settings: Settings) -> DistributionTls | None:
    """The TLS settings, or None (plaintext). A key without a certificate is an error."""
    files = tls_files_from(
        settings.grpc_tls_cert,
        settings.grpc_tls_key,
        settings.grpc_tls_client_ca,
        env_prefix="MESHPLANE_GRPC_TLS",
    )
    return None if files is None else DistributionTls(*files.paths)


class Distribution:
    """Owns the ``PolicyDistribution`` server and the subscriber registry."""

    def __init__(
        self,
        engine: Engine,
        listen: str,
        *,
        tls: DistributionTls | None = None,
        stale_after: float = DEFAULT_STALE_AFTER_SECONDS,
    ) -> None:
        self._engine = engine
        self.listen = listen
        self.tls = tls
        self.backend = StoreBackend(engine)
        self.registry = SubscriberRegistry(stale_after=stale_after)
        self.feed: ChangeFeed | None = None
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: grpc.aio.Server | None = None
        self._poller: asyncio.Task[None] | None = None

    @classmethod
    def from_settings(cls, engine: Engine, settings: Settings) -> Distribution | None:
        """The distribution plane the settings ask for; None when ``grpc_listen`` is off."""
        if not settings.grpc_listen:
            return None
        stale_after = parse_duration(
            settings.distribution_stale_after, "MESHPLANE_DISTRIBUTION_STALE_AFTER"
        )
        return cls(engine, settings.grpc_listen, tls=tls_from(settings), stale_after=stale_after)

    async def _read_revision(self) -> int:
        def read() -> int:
            with read_tx(self._engine) as conn:
                return repo.current_revision(conn)

        return await asyncio.to_thread(read)

    async def start(self) -> None:
        """Bind and start serving; raises if the address cannot be bound."""
        self._loop = asyncio.get_running_loop()
        self.feed = ChangeFeed(self._read_revision)
        self.feed.notify(await self._read_revision())
        servicer = DistributionServicer(
            self.backend.build,
            self.backend.authenticate,
            self.feed,
            self.registry,
            heartbeat=REVALIDATE_SECONDS,
            still_admitted=self.backend.still_admitted,
        )
        server = grpc.aio.server(options=SERVER_OPTIONS)
        pb_grpc.add_PolicyDistributionServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
        if self.tls is not None:
            port = server.add_secure_port(self.listen, self.tls.server_credentials())
        else:
            port = server.add_insecure_port(self.listen)
        if port == 0:
            raise OSError(f"cannot listen for gRPC on {self.listen}")
        await server.start()
        self._server, self.port = server, port
        self._poller = asyncio.create_task(self.feed.poll_store(STORE_POLL_SECONDS))
        host = self.listen.rpartition(":")[0]
        mode = "plaintext" if self.tls is None else "mtls" if self.tls.client_ca_file else "tls"
        log.info("policy distribution listening", extra={"address": f"{host}:{port}", "tls": mode})
        if self.tls is None and not is_loopback_host(self.listen.rpartition(":")[0]):
            log.warning(
                "the policy stream is served without TLS on a non-loopback address: snapshots "
                "(with inline JWT secrets) and subscriber tokens cross the network in clear; "
                "set MESHPLANE_GRPC_TLS_CERT and MESHPLANE_GRPC_TLS_KEY",
                extra={"address": self.listen},
            )

    async def stop(self, grace: float = 2.0) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        if self._server is not None:
            await self._server.stop(grace)

    def committed(self, revision: int) -> None:
        """Called from any thread after a write transaction committed."""
        loop, feed = self._loop, self.feed
        if loop is None or feed is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # loop shutting down
            loop.call_soon_threadsafe(feed.notify, revision)

    def desired_versions(
        self, organization: str, cluster: str
    ) -> tuple[dict[str, str], dict[str, str]]:
        """(kind → the version the cluster's policies compile to, kind → compile error)."""
        desired: dict[str, str] = {}
        errors: dict[str, str] = {}
        for kind in KINDS:
            try:
                node = NodeIdentity(kind, organization, cluster, "")
                desired[kind] = self.backend.build_sync(node).version
            except Exception as exc:
                # A stored object the compiler rejects (written around the
                # API's validation): streams fail and subscribers keep their
                # last good snapshot; the status says why instead of a 500.
                log.exception("cannot compile the cluster's snapshot", extra={"kind": kind})
                desired[kind] = ""
                errors[kind] = f"{type(exc).__name__}: {str(exc)[:500]}"
        return desired, errors

    def instances(
        self, organization: str, cluster: str, desired: dict[str, str], kinds: Iterable[str] = KINDS
    ) -> list[dict[str, Any]]:
        """The registry's view of the cluster's instances of ``kinds``, with ``upToDate``."""
        now = time.time()
        wanted = set(kinds)
        out = []
        for status in self.registry.for_cluster(organization, cluster, now):
            if status.node.kind not in wanted:
                continue
            view = status.to_json(now, self.registry.stale_after)
            view["upToDate"] = status.applied_version == desired.get(status.node.kind)
            out.append(view)
        return out

    def cluster_status(self, organization: str, cluster: str) -> dict[str, Any]:
        """Per instance: applied version, ACK/NACK, last contact, stale; plus the
        version each service kind should have, so "up to date" is answerable."""
        desired, errors = self.desired_versions(organization, cluster)
        out: dict[str, Any] = {
            "cluster": cluster_fqn(organization, cluster),
            "desiredVersions": desired,
            "instances": self.instances(organization, cluster, desired),
        }
        if errors:
            out["compileErrors"] = errors
        return out

    def kind_status(self, organization: str, cluster: str, kind: str) -> dict[str, Any]:
        """One cluster seen from a policy of ``kind``'s service: its desired version
        of that kind and that kind's instances only."""
        desired, errors = self.desired_versions(organization, cluster)
        out: dict[str, Any] = {
            "cluster": cluster_fqn(organization, cluster),
            "desiredVersion": desired[kind],
            "instances": self.instances(organization, cluster, desired, (kind,)),
        }
        if kind in errors:
            out["compileError"] = errors[kind]
        return out
