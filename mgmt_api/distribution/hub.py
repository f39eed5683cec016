"""The policy distribution plane inside ``mgmt-api serve``: the gRPC server and its feed.

One gRPC server, one port, serves the ``PolicyDistribution`` stream of the
ratelimit and extauthz instances, Envoy's Aggregated Discovery Service for
the gateways and sidecars (:mod:`mgmt_api.distribution.ads`), the agent
tunnel, and ``WorkloadCertificates/Sign`` for the pod-local sidecar agents
(:mod:`mgmt_api.distribution.workload_certs`); the streams wake on the same feed.

It runs in the same event loop as the REST app (started and stopped by the
FastAPI lifespan). A committed write reaches the open snapshot streams
without any broker:

- writes in this process: the unit of work tells its commit listeners
  (:class:`mgmt_api.store.uow.CommitListeners`) the new revision right after
  the commit, and :meth:`Distribution.committed` hands it to the
  :class:`~mgmt_api.distribution.feed.ChangeFeed` on the loop;
- writes of other replicas: on PostgreSQL each write also sends ``NOTIFY``,
  which :func:`mgmt_api.store.notify.listen_revisions` hears within
  milliseconds; a slow poll of the stored revision stays behind it (and is
  the only cross-process path on SQLite, which has no notifications);
- changes of the mesh's endpoint registry (sidecars joining and leaving,
  :mod:`mgmt_api.store.sidecars`) are not revisions: they arrive on their
  own channel, ``meshplane_sidecars``, and wake only the sidecar streams.

What a stream sends comes from the read model (:mod:`mgmt_api.service.enforcement`),
who may open one from :mod:`mgmt_api.service.stream_auth`, and what each
instance applied goes to the registry the status views read
(:mod:`mgmt_api.service.instances`).

Snapshots carry inline key material (HMAC secrets of ExtAuthzPolicies), so
the stream is meant to run over TLS (settings ``MESHPLANE_GRPC_TLS_CERT`` /
``_KEY``, and ``_CLIENT_CA`` to also require a client certificate; the files
are followed on disk, :mod:`meshplane.tls`); without it the server logs a
warning when it listens on anything but loopback. HTTP/2
keepalive pings (:data:`SERVER_OPTIONS`) close connections whose peer is
gone, so a half-open subscriber does not look connected forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from opentelemetry.trace import Tracer

from meshplane.distribution_contract import NodeIdentity
from meshplane.netaddr import is_loopback_host
from meshplane.proto.distribution.v1 import distribution_pb2_grpc as pb_grpc
from meshplane.tls import ListenerTlsFiles, grpcio_credentials, tls_files_from
from meshplane.tracing import child_span
from mgmt_api.auth import tokens
from mgmt_api.compiler.gateway_xds import GatewayInput
from mgmt_api.compiler.sidecar_xds import SidecarInput
from mgmt_api.distribution.ads import AggregatedDiscoveryServicer
from mgmt_api.distribution.feed import ChangeFeed
from mgmt_api.distribution.metrics import AttestationCounts
from mgmt_api.distribution.server import DistributionServicer
from mgmt_api.distribution.sidecar_ads import SidecarStreams
from mgmt_api.distribution.wire import add_to_server as add_ads_to_server
from mgmt_api.distribution.workload_certs import WorkloadCertificatesServicer, add_to_server
from mgmt_api.domain import ca_rotation, cluster_accounts, mesh_ca
from mgmt_api.domain.durations import parse_duration, shortest_duration
from mgmt_api.errors import invalid
from mgmt_api.service.enforcement import EnforcementService, Snapshot
from mgmt_api.service.instances import SubscriberRegistry
from mgmt_api.service.mesh_ca import MeshCaStore, advance_forever
from mgmt_api.service.stream_auth import AuthError, Revocation, StreamAuth
from mgmt_api.service.workload_trust import Attestation, WorkloadTrustStore
from mgmt_api.settings import Settings
from mgmt_api.store.notify import SIDECARS_CHANNEL, listen_revisions
from mgmt_api.store.uow import UnitOfWork

log = logging.getLogger(__name__)

# Without notifications (SQLite) this poll is how other processes' writes are
# seen; with them (PostgreSQL) it only backs up a listener that lost its
# connection, so it can be slow.
STORE_POLL_SECONDS = 1.0
STORE_POLL_WITH_NOTIFY_SECONDS = 30.0
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
    # gRPC sets SO_REUSEPORT by default on Linux: a second mgmt-api would then
    # share the port and split the gateways and sidecars between two control
    # planes. Off, a taken port fails the bind (see Distribution.start).
    ("grpc.so_reuseport", 0),
)


def tls_from(settings: Settings) -> ListenerTlsFiles | None:
    """The TLS settings, or None (plaintext). A key without a certificate is an error."""
    files = tls_files_from(
        settings.grpc_tls_cert,
        settings.grpc_tls_key,
        settings.grpc_tls_client_ca,
        env_prefix="MESHPLANE_GRPC_TLS",
    )
    return files


def certificate_ttl(settings: Settings) -> float:
    """``MESHPLANE_SIDECAR_CERT_TTL`` in seconds, within the bounds of ``mesh_ca``."""
    return _bounded_duration(
        settings.sidecar_certificate_ttl,
        "MESHPLANE_SIDECAR_CERT_TTL",
        (mesh_ca.MIN_SVID_TTL, mesh_ca.MAX_SVID_TTL),
    )


def mesh_ca_settle(settings: Settings) -> float:
    """``MESHPLANE_MESH_CA_SETTLE`` in seconds, within the bounds of ``ca_rotation``."""
    return _bounded_duration(
        settings.mesh_ca_settle,
        "MESHPLANE_MESH_CA_SETTLE",
        (ca_rotation.MIN_SETTLE, ca_rotation.MAX_SETTLE),
    )


def _bounded_duration(value: str, field_name: str, bounds: tuple[float, float]) -> float:
    """``value`` (a duration) in seconds; a 400 naming ``field_name`` and the bounds
    outside them."""
    seconds = parse_duration(value, field_name)
    low, high = bounds
    if not low <= seconds <= high:
        refusal = f"must be between {shortest_duration(low)} and {shortest_duration(high)}"
        raise invalid(field_name, refusal)
    return seconds


@dataclass
class Distribution:
    """Owns the ``PolicyDistribution`` gRPC server and the feed that wakes its streams.

    ``database_url`` is followed with ``LISTEN`` when it is PostgreSQL's;
    ``revision_poll`` overrides the backing poll's interval (seconds).
    """

    uow: UnitOfWork
    listen: str
    enforcement: EnforcementService
    stream_auth: StreamAuth
    registry: SubscriberRegistry
    #: Verifies workload tokens (Sign, sidecar ADS); by default over its own read model.
    attestation: Attestation | None = None
    tls: ListenerTlsFiles | None = None
    database_url: str | None = None
    revision_poll: float | None = None
    #: Lifetime of the workload certificates Sign issues (MESHPLANE_SIDECAR_CERT_TTL).
    certificate_ttl: float = mesh_ca.DEFAULT_SVID_TTL
    #: A CA rotation phase's wait after its last certificate (MESHPLANE_MESH_CA_SETTLE).
    ca_settle: float = ca_rotation.SETTLE
    #: Sign's and sidecar admission's outcomes (a Prometheus collector).
    counts: AttestationCounts = field(default_factory=AttestationCounts)
    feed: ChangeFeed | None = field(default=None, init=False)
    port: int | None = field(default=None, init=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, init=False)
    _server: grpc.aio.Server | None = field(default=None, init=False)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list, init=False)
    _cas: MeshCaStore = field(init=False)
    #: Other services on the same gRPC server, port and TLS (the agent tunnel):
    #: each is called with the server before it starts.
    servicers: list[Callable[[grpc.aio.Server], None]] = field(default_factory=list, init=False)
    #: Set by the wiring when tracing is on: a publish under a sampled request is a span.
    tracer: Tracer | None = field(default=None, init=False)

    @property
    def _notify_url(self) -> str | None:
        """Set on PostgreSQL: other replicas' commits arrive as notifications."""
        postgres = self.uow.engine.dialect.name == "postgresql"
        return self.database_url if postgres else None

    async def _read_revision(self) -> int:
        return await asyncio.to_thread(self.uow.current_revision)

    async def _build(self, node: NodeIdentity) -> Snapshot:
        return await self.enforcement.snapshot_async(node.kind, node.organization, node.cluster)

    async def _authenticate(self, token: str, node: NodeIdentity) -> str:
        return await self._admit(token, node, tokens.DISTRIBUTION_AUDIENCE)

    async def _authenticate_gateway(self, token: str, node: NodeIdentity) -> str:
        return await self._admit(token, node, tokens.GATEWAY_AUDIENCE)

    async def _admit(self, token: str, node: NodeIdentity, audience: str) -> str:
        """The stream's channel (its audience and node kind) decides which account may open it."""
        channel = cluster_accounts.channel_for(audience, node.kind)
        if channel is None:
            raise AuthError(f"no cluster credential opens this stream as {node.kind!r}")
        return await self.stream_auth.authenticate_async(
            token, node.organization, node.cluster, channel
        )

    async def _build_gateway(self, key: tuple[str, str]) -> GatewayInput:
        return await self.enforcement.gateway_async(*key)

    async def _build_sidecar(self, key: tuple[str, str]) -> SidecarInput:
        return await self.enforcement.sidecar_async(*key)

    async def _trust_bundle(self, key: tuple[str, str]) -> tuple[str, ...]:
        return await asyncio.to_thread(self._cas.trust_bundle, *key)

    def _sidecar_streams(self, feed: ChangeFeed, attestation: Attestation) -> SidecarStreams | None:
        """The sidecar half of ADS, when the enforcement service has a sidecar directory."""
        if self.enforcement.sidecars is None:
            return None
        sidecars = SidecarStreams(
            self._build_sidecar,
            self._trust_bundle,
            self.enforcement.sidecars,
            feed,
            self.registry,
            attestation=attestation,
            counts=self.counts,
            heartbeat=REVALIDATE_SECONDS,
        )
        self._tasks.extend(sidecars.start())
        if self._notify_url is not None:
            self._tasks.append(
                asyncio.create_task(self._listen_sidecars(self._notify_url, sidecars))
            )
        self._tasks.append(asyncio.create_task(advance_forever(self._cas)))
        return sidecars

    def _workload_certificates(self, attestation: Attestation) -> WorkloadCertificatesServicer:
        return WorkloadCertificatesServicer(
            attestation,
            self._cas,
            self.counts,
            directory=self.enforcement.sidecars,
            certificate_ttl=self.certificate_ttl,
        )

    async def _still_admitted(self, key_id: str, node: NodeIdentity) -> Revocation | None:
        return await self.stream_auth.still_admitted_async(key_id, node.organization, node.cluster)

    async def start(self) -> None:
        """Bind and start serving; raises if the address cannot be bound."""
        self._loop = asyncio.get_running_loop()
        feed = self.feed = ChangeFeed(self._read_revision)
        feed.notify(await self._read_revision())
        self.uow.listeners.subscribe(self.committed)
        self._cas = MeshCaStore(self.uow, settle=self.ca_settle)
        attestation = self.attestation or Attestation(self.uow, WorkloadTrustStore(self.uow))
        servicer = DistributionServicer(
            self._build,
            self._authenticate,
            feed,
            self.registry,
            heartbeat=REVALIDATE_SECONDS,
            still_admitted=self._still_admitted,
        )
        server = grpc.aio.server(options=SERVER_OPTIONS)
        pb_grpc.add_PolicyDistributionServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
        gateways = AggregatedDiscoveryServicer(
            self._build_gateway,
            self._authenticate_gateway,
            feed,
            self.registry,
            heartbeat=REVALIDATE_SECONDS,
            still_admitted=self._still_admitted,
            sidecars=self._sidecar_streams(feed, attestation),
        )
        add_ads_to_server(gateways, server)
        add_to_server(self._workload_certificates(attestation), server)
        for add in self.servicers:
            add(server)
        port = self._bind(server)
        await server.start()
        self._server, self.port = server, port
        poll = STORE_POLL_SECONDS
        if self._notify_url is not None:
            poll = STORE_POLL_WITH_NOTIFY_SECONDS
            self._tasks.append(asyncio.create_task(self._listen(self._notify_url, feed)))
        poll = self.revision_poll if self.revision_poll is not None else poll
        self._tasks.append(asyncio.create_task(feed.poll_store(poll)))
        host = self.listen.rpartition(":")[0]
        mode = "plaintext" if self.tls is None else self.tls.mode
        log.info("policy distribution listening", extra={"address": f"{host}:{port}", "tls": mode})
        if self.tls is None and not is_loopback_host(self.listen.rpartition(":")[0]):
            log.warning(
                "the policy stream is served without TLS on a non-loopback address: snapshots "
                "(with inline JWT secrets) and subscriber tokens cross the network in clear; "
                "set MESHPLANE_GRPC_TLS_CERT and MESHPLANE_GRPC_TLS_KEY",
                extra={"address": self.listen},
            )

    async def _listen_sidecars(self, url: str, sidecars: SidecarStreams) -> None:
        """Other replicas' changes of the mesh's endpoint registry (and, after each
        (re)connect, whatever changed while not listening)."""
        moved = sidecars.registry_moved
        await listen_revisions(url, lambda _: moved(), connected=moved, channel=SIDECARS_CHANNEL)

    def _bind(self, server: grpc.aio.Server) -> int:
        """Add the listening port; raise OSError naming the address and the
        flag when it cannot be bound (taken: reuse of the port is off)."""
        try:
            if self.tls is not None:
                port = server.add_secure_port(self.listen, grpcio_credentials(self.tls))
            else:
                port = server.add_insecure_port(self.listen)
        except RuntimeError:  # grpcio's "Failed to bind to address ..."
            port = 0
        if port == 0:
            raise OSError(
                f"cannot listen for gRPC on {self.listen} (--grpc-listen): the port is in use"
                " or the address is not this host's"
            )
        return port

    async def _listen(self, url: str, feed: ChangeFeed) -> None:
        """Other replicas' commits, as PostgreSQL notifications."""

        def caught_up() -> None:
            # (Re)connected: whatever was committed while not listening.
            self._tasks.append(asyncio.create_task(self._catch_up(feed)))

        await listen_revisions(url, feed.notify, connected=caught_up)

    async def _catch_up(self, feed: ChangeFeed) -> None:
        with contextlib.suppress(Exception):  # the poll covers a failed read
            feed.notify(await self._read_revision())

    async def stop(self, grace: float = 2.0) -> None:
        if self.enforcement.sidecars is not None:
            # The sidecars reconnect to a replica: stopping takes no endpoint away.
            self.enforcement.sidecars.closing()
        self.uow.listeners.unsubscribe(self.committed)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            await self._server.stop(grace)

    def committed(self, revision: int) -> None:
        """Called from any thread after a write transaction committed."""
        loop, feed = self._loop, self.feed
        if loop is None or feed is None or loop.is_closed():
            return
        # The callback runs in a copy of this thread's context, so the span
        # of the request that wrote (if sampled) is the publish's parent.
        with contextlib.suppress(RuntimeError):  # loop shutting down
            loop.call_soon_threadsafe(self._publish, feed, revision)

    def _publish(self, feed: ChangeFeed, revision: int) -> None:
        """Wake the streams (each then sends its cluster's new snapshot)."""
        with child_span(self.tracer, "mgmt-api publish", {"meshplane.revision": revision}):
            feed.notify(revision)
