"""The sidecar half of the ADS server (:mod:`mgmt_api.distribution.ads`).

Sidecars share the gateway's ADS protocol handling and differ in four ways,
all kept here:

- **admission** (:meth:`SidecarStreams.admit`): the stream's bearer is the
  pod's workload token (relayed by the pod-local sidecar agent), verified
  like ``WorkloadCertificates/Sign`` verifies it
  (:class:`~mgmt_api.service.workload_trust.Attestation`); the cluster
  agent's key and the gateway token are no workload's, so they never verify.
  The node metadata must announce the verified namespace and service account,
  a service the pod is in and the pod's address
  (:func:`~mgmt_api.domain.workload_attest.sidecar_refusal`): otherwise
  PERMISSION_DENIED, and the refusal is audited. Every wake re-checks that
  the pod is still in the inventory with the same uid (:meth:`SidecarStreams.still_admitted`):
  a deleted pod's stream closes, and it leaves the endpoints;
- their resources are :mod:`mgmt_api.compiler.sidecar_xds`'s, built in
  pieces, each serialized once per distinct input and shared by every
  sidecar it is the same for (:meth:`SidecarStreams.compile`): a cluster's
  outbound clusters once per version (and a service's cluster only when its
  endpoints change), a namespace's routes and authorization once per
  policy, a sidecar's own listeners once per policy. Nothing is rebuilt
  when the cluster's input digest and trust bundle are what the stream was
  last sent (a heartbeat, another cluster's write), and building runs off
  the event loop that accepts streams;
- their endpoints come from the registry every replica shares
  (:class:`~mgmt_api.service.sidecars.SidecarDirectory`): a join or leave is
  a store write, so it wakes the streams of every replica like any other
  write;
- the only secret served is the cluster's trust bundle
  (:data:`~meshplane.workload_contract.CA_SECRET`). The workload certificate
  and its key never pass here: the pod-local agent holds the key, has it
  signed through Sign and serves it to Envoy over SDS in the pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field

from meshplane.distribution_contract import NodeIdentity
from meshplane.sidecar_contract import SidecarNode
from mgmt_api.compiler import mesh_authz, sidecar_xds
from mgmt_api.compiler import tracing as tracing_settings
from mgmt_api.compiler.gateway_xds import CLUSTER_TYPE, LISTENER_TYPE, ROUTE_TYPE, SECRET_TYPE
from mgmt_api.compiler.protojson import JsonDict
from mgmt_api.compiler.sidecar_xds import ENDPOINT_TYPE
from mgmt_api.distribution.feed import ChangeFeed, SharedBuilds
from mgmt_api.distribution.metrics import AttestationCounts
from mgmt_api.distribution.streams import Admitted, StreamPlane
from mgmt_api.distribution.wire import Compiled, Entry, EntryCache, Miss, Templates, entry
from mgmt_api.domain import workload_attest
from mgmt_api.domain.workload_attest import AttestationError, sidecar_refusal
from mgmt_api.service.enforcement import UnknownCluster
from mgmt_api.service.instances import SubscriberRegistry
from mgmt_api.service.sidecars import SidecarDirectory
from mgmt_api.service.stream_auth import AuthError, Revocation
from mgmt_api.service.workload_trust import Attestation

log = logging.getLogger(__name__)

# (organization, cluster) → the cluster's sidecar input.
SidecarBuild = Callable[[tuple[str, str]], Awaitable[sidecar_xds.SidecarInput]]
# (organization, cluster) → the cluster's trust bundle (PEMs, the signing CA first).
BundleSource = Callable[[tuple[str, str]], Awaitable[tuple[str, ...]]]
#: How long the store must be quiet before the sidecars' feed moves (see follow_store).
DEBOUNCE_SECONDS = 0.1
#: The longest a write waits for a quiet store.
DEBOUNCE_MAX_SECONDS = 1.0
#: How old the attestation read model a stream's re-check reads may be.
TRUST_FRESH_SECONDS = 1.0
#: The audit operation of a refused sidecar stream.
REFUSE_SIDECAR = "REFUSE_SIDECAR"


class SidecarStreams:
    """What every sidecar stream of one ADS server shares (see the module docstring)."""

    def __init__(
        self,
        build: SidecarBuild,
        bundle: BundleSource,
        directory: SidecarDirectory,
        store_feed: ChangeFeed,
        registry: SubscriberRegistry,
        *,
        attestation: Attestation,
        counts: AttestationCounts | None = None,
        clock: Callable[[], float] = time.time,
        heartbeat: float = 30.0,
    ) -> None:
        self.directory = directory
        self.attestation = attestation
        self.counts = counts or AttestationCounts()
        self.feed = ChangeFeed()
        self.plane = StreamPlane(self.feed, registry, self.still_admitted, clock, heartbeat)
        self._store_feed = store_feed
        self._build, self._bundle = build, bundle
        # One store read and one serialization of what every sidecar of a
        # cluster shares, per cluster and change (a CA changes only with a
        # write: a new trust domain, a recreated cluster, a rotation).
        self._shared: SharedBuilds[tuple[str, str], SharedBuild] = SharedBuilds(
            self.feed, self._prepare
        )
        self.cache = EntryCache()
        self.templates = Templates()  # sidecars' listeners differ in their address only
        self.assembled = 0  # sidecar configurations assembled (tests read it)
        self._leaving: set[asyncio.Task[None]] = set()
        # What the sidecars' input follows: the store's writes and the registry's moves.
        self._inputs = ChangeFeed()
        self._loop: asyncio.AbstractEventLoop | None = None
        directory.listeners.append(self._registry_changed)
        self._trusts: dict[
            tuple[str, str], tuple[float, asyncio.Future[workload_attest.ClusterTrust]]
        ] = {}
        # (organization, cluster) → the sidecar streams attached here (insertion
        # ordered), whose own pieces a new version builds at once, in one thread
        # hop, and which the pusher hands each new version.
        self._attached: dict[tuple[str, str], dict[Attached, None]] = {}
        self._last: dict[tuple[str, str], SharedBuild] = {}  # per cluster
        self._pushed: dict[tuple[str, str], SharedBuild] = {}  # per cluster
        self._seq = 0  # numbers the shared builds (a Compiled's seq)

    async def follow_store(self) -> None:
        """Every move of the store's feed is a change of the sidecars' input; cancel to stop."""
        seen = self._store_feed.revision
        while True:
            seen = await self._store_feed.wait_beyond(seen)
            self._inputs.notify()

    def registry_moved(self) -> None:
        """The endpoint registry changed (another replica's NOTIFY); on the loop."""
        self._inputs.notify()

    def _registry_changed(self) -> None:
        """This replica changed the registry; from any thread."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop is shutting down
                loop.call_soon_threadsafe(self._inputs.notify)

    async def debounce(self) -> None:
        """Move the sidecar feed when the input changed, a burst of changes at once; cancel
        to stop.

        After a change, the feed moves once the input has been quiet for
        :data:`DEBOUNCE_SECONDS`, or :data:`DEBOUNCE_MAX_SECONDS` after that
        change however busy it stays (Istio debounces its pushes alike): a
        join storm compiles a few versions, not one per sidecar.
        """
        seen = self._inputs.revision
        while True:
            seen = await self._inputs.wait_beyond(seen)
            first = time.monotonic()
            while time.monotonic() - first < DEBOUNCE_MAX_SECONDS:
                moved = await self._inputs.wait_beyond(seen, DEBOUNCE_SECONDS)
                if moved == seen:
                    break
                seen = moved
            self.feed.notify()

    def start(self) -> list[asyncio.Task[None]]:
        """Follow the store's feed, push new versions to the attached streams, re-check
        their credentials; keep this replica's rows in the registry fresh."""
        self._loop = asyncio.get_running_loop()
        return [
            asyncio.create_task(self.follow_store()),
            asyncio.create_task(self.debounce()),
            asyncio.create_task(self.push_forever()),
            asyncio.create_task(self.directory.refresh_forever()),
        ]

    def attach(self, admitted: Admitted, node: SidecarNode) -> Attached:
        """A sidecar stream starts here: from now on the pusher hands it each new version."""
        attached = Attached(node, admitted)
        self._attached.setdefault((node.organization, node.cluster), {})[attached] = None
        return attached

    def detach(self, attached: Attached) -> None:
        """The stream ended: it is no longer pushed to or built ahead."""
        streams = self._attached.get((attached.node.organization, attached.node.cluster), {})
        streams.pop(attached, None)

    async def push_forever(self) -> None:
        """One loop for every sidecar stream of this replica; cancel to stop.

        On each move of the (debounced) feed, each cluster with streams here is
        built once; when that build is new, each stream is handed its own
        configuration (assembled ahead, off the loop) in its inbox: one wake-up
        of the streams that have something to send, and none otherwise. Every
        :attr:`StreamPlane.heartbeat` seconds without a change, and after each
        change, the streams' pods are re-checked in one pass per cluster (a
        dictionary look-up each): an idle stream costs nothing but that.
        """
        revision = self.feed.revision
        while True:
            moved = await self.feed.wait_beyond(revision, self.plane.heartbeat)
            changed, revision = moved != revision, moved
            for key in list(self._attached):
                try:
                    await self._round(key, revision, changed=changed)
                except Exception:  # one cluster's failure is not every cluster's
                    log.exception("cannot serve the sidecars of a cluster")

    async def _round(self, key: tuple[str, str], revision: int, *, changed: bool) -> None:
        streams = self._attached.get(key)
        if not streams:
            self._attached.pop(key, None)
            self._pushed.pop(key, None)
            return
        try:
            trust = await self._trust(key)
        except UnknownCluster:
            self._revoke(streams, Revocation("the cluster was deleted", cluster_gone=True))
            return
        now = self.plane.clock()
        for attached in list(streams):
            gone = workload_attest.still_there(trust, attached.admitted.grant)
            if gone is not None:
                self._revoke({attached: None}, Revocation(gone))
            else:
                self.plane.registry.heartbeat(attached.admitted.node, now)
        if not changed:
            return
        try:
            shared = await self._shared.get(key, revision)
        except UnknownCluster:
            self._revoke(streams, Revocation("the cluster was deleted", cluster_gone=True))
            return
        if self._pushed.get(key) is shared:
            return  # nothing that reaches this cluster's sidecars changed
        self._pushed[key] = shared
        for attached in list(streams):
            compiled = shared.prepared.get(attached.node)
            if compiled is None:
                try:
                    compiled = self.assemble(shared, attached.node)
                except Exception:  # Envoy's protos refuse it: the sidecar keeps what it has
                    log.exception(
                        "cannot compile the sidecar's configuration",
                        extra={"cluster": key[1], "instance": attached.node.instance},
                    )
                    continue
            attached.inbox.put_nowait(compiled)

    def _revoke(self, streams: dict[Attached, None], revoked: Revocation) -> None:
        for attached in list(streams):
            self.detach(attached)
            attached.inbox.put_nowait(revoked)

    async def join(self, node: SidecarNode, grant: str) -> int:
        """Register an admitted sidecar in the shared registry (a store write)."""
        return await asyncio.to_thread(self.directory.join, node, grant)

    def leave(self, handle: int) -> None:
        """The stream ``handle`` ended: leave the registry, even though the call that
        held it is being cancelled (the write runs in a task of its own)."""
        task = asyncio.create_task(self._leave(handle))
        self._leaving.add(task)
        task.add_done_callback(self._leaving.discard)

    async def _leave(self, handle: int) -> None:
        try:
            await asyncio.to_thread(self.directory.leave, handle)
        except Exception:  # the store is down: the row goes stale and is swept
            log.exception("cannot remove a sidecar from the registry")

    async def admit(self, token: str, node: SidecarNode) -> str:
        """The grant of a sidecar stream whose bearer is ``token``; :class:`AuthError` if not.

        The grant (the pod and its uid) is what :meth:`still_admitted` re-checks.
        """
        org, cluster = node.organization, node.cluster
        try:
            attested = await asyncio.to_thread(self.attestation.verify, token, org, cluster)
        except UnknownCluster:
            self.counts.admission("cluster")
            raise AuthError(f"no cluster {node.node_cluster}") from None
        except AttestationError as exc:
            self.counts.admission(exc.reason)
            log.warning(
                "refused a sidecar stream",
                extra={
                    "cluster": node.node_cluster,
                    "instance": node.instance[:256],
                    "error": str(exc),
                },
            )
            raise AuthError(str(exc)) from None
        refusal = sidecar_refusal(attested, node)
        if refusal is not None:
            self.counts.admission(refusal.reason)
            log.warning(
                "refused a sidecar stream",
                extra={
                    "cluster": node.node_cluster,
                    "instance": node.instance[:256],
                    "pod": f"{attested.pod.namespace}/{attested.pod.name}",
                    "error": str(refusal),
                },
            )
            try:
                await asyncio.to_thread(
                    self.attestation.audit_refusal,
                    org,
                    cluster,
                    attested,
                    refusal,
                    operation=REFUSE_SIDECAR,
                    instance=node.instance,
                )
            except Exception:  # the refusal stands even when the store cannot record it
                log.exception("cannot audit a refused sidecar stream")
            raise AuthError(str(refusal))
        self.counts.admission()
        return attested.grant

    async def still_admitted(self, grant: str, node: NodeIdentity) -> Revocation | None:
        """None while the stream's pod is in the inventory with its uid."""
        try:
            trust = await self._trust((node.organization, node.cluster))
        except UnknownCluster:
            return Revocation("the cluster was deleted", cluster_gone=True)
        gone = workload_attest.still_there(trust, grant)
        return None if gone is None else Revocation(gone)

    async def _trust(self, key: tuple[str, str]) -> workload_attest.ClusterTrust:
        """The cluster's attestation read model, read once per :data:`TRUST_FRESH_SECONDS`
        for all its streams (one store read, not one thread hop per stream and wake)."""
        now = time.monotonic()
        entry = self._trusts.get(key)
        if (
            entry is None
            or now - entry[0] > TRUST_FRESH_SECONDS
            or (entry[1].done() and entry[1].exception() is not None)
        ):
            read = asyncio.to_thread(self.attestation.trust.get, *key)
            entry = self._trusts[key] = (now, asyncio.ensure_future(read))
        return await asyncio.shield(entry[1])

    async def _prepare(self, key: tuple[str, str]) -> SharedBuild:
        inp = await self._build(key)
        bundle = await self._bundle(key)
        last = self._last.get(key)
        if last is not None and last.inp == inp and last.bundle == bundle:
            return last  # another cluster's write, or nothing that reaches sidecars
        nodes = list({a.node: None for a in self._attached.get(key, {})})
        self._seq += 1
        shared = await asyncio.to_thread(self._prepare_all, inp, bundle, nodes, self._seq)
        self._last[key] = shared
        return shared

    def _prepare_all(
        self,
        inp: sidecar_xds.SidecarInput,
        bundle: tuple[str, ...],
        nodes: list[SidecarNode],
        seq: int,
    ) -> SharedBuild:
        """What the cluster's sidecars share, and the configuration of each sidecar
        streaming here, so that the pusher only hands them out on the loop."""
        shared = self._prepare_shared(inp, bundle, seq)
        for node in nodes:
            with contextlib.suppress(Exception):  # the pusher logs it when it assembles
                shared.prepared[node] = self.assemble(shared, node)
        return shared

    def _prepare_shared(
        self, inp: sidecar_xds.SidecarInput, bundle: tuple[str, ...], seq: int = 0
    ) -> SharedBuild:
        services = inp.services()
        outbound: list[Entry] = []
        assignments: list[Entry] = []
        shapes = []  # what the clusters are made from (their type's version)
        placed = []  # what the assignments are made from (theirs)
        for (namespace, service), endpoints in sorted(services.items()):
            accounts = tuple(sorted({e.service_account for e in endpoints}))
            shapes.append([namespace, service, list(accounts)])
            key = ("out", inp.trust_domain, namespace, service, accounts)
            outbound.extend(
                self.cache.get(
                    key,
                    lambda n=namespace, s=service, e=endpoints: [  # type: ignore[misc]
                        entry(CLUSTER_TYPE, sidecar_xds.outbound_cluster(inp, n, s, e))
                    ],
                )
            )
            addresses = tuple((e.host, e.port) for e in endpoints)
            placed.append([namespace, service, [list(a) for a in addresses]])
            assignments.extend(
                self.cache.get(
                    ("eds", namespace, service, addresses),
                    lambda n=namespace, s=service, e=endpoints: [  # type: ignore[misc]
                        entry(ENDPOINT_TYPE, sidecar_xds.load_assignment(n, s, e))
                    ],
                )
            )
        names = json.dumps(sorted(services), separators=(",", ":")).encode()
        policy = sidecar_xds.policy_digest(inp)
        serial = hashlib.sha256("".join(bundle).encode()).hexdigest()[:16]
        extra: tuple[Entry, ...] = ()
        if inp.knobs.tracing is not None:
            tracing = inp.knobs.tracing
            extra = self.cache.get(
                ("tracing", policy),
                lambda: [entry(CLUSTER_TYPE, sidecar_collector(tracing))],
            )
        secrets = self.cache.get(
            ("secret", serial),
            lambda: [entry(SECRET_TYPE, s) for s in sidecar_xds.secrets(bundle)],
        )
        # The clusters' version names what they are made from, not the whole policy: a
        # policy change that leaves every cluster as it was resends no clusters.
        made_of = json.dumps([inp.trust_domain, shapes], separators=(",", ":")).encode()
        shape = made_of + b"".join(data for _, data in extra)
        return SharedBuild(
            inp, bundle, inp.version(), policy, serial, secrets, (*outbound, *extra),
            tuple(assignments), hashlib.sha256(names).hexdigest()[:20],
            hashlib.sha256(shape).hexdigest()[:20],
            hashlib.sha256(json.dumps(placed, separators=(",", ":")).encode()).hexdigest()[:20],
            seq,
        )  # fmt: skip

    async def compile(
        self, node: SidecarNode, revision: int, previous: Compiled | None
    ) -> Compiled | None:
        """This sidecar's resources at ``revision``: ``previous`` itself when the cluster's
        input and trust bundle are unchanged; None when they cannot compile."""
        try:
            shared = await self._shared.get((node.organization, node.cluster), revision)
        except UnknownCluster:
            raise
        except Exception:
            log.exception(
                "cannot compile the sidecar's configuration",
                extra={"cluster": node.cluster, "instance": node.instance},
            )
            return None
        if (
            previous is not None
            and previous.version == shared.version
            and previous.serial == shared.serial
        ):
            return previous  # nothing changed: nothing rebuilt
        prepared = shared.prepared.get(node)
        if prepared is not None:
            return prepared
        try:
            try:
                return self.assemble(shared, node, build=False)
            except Miss:  # a piece to build: off the loop
                return await asyncio.to_thread(self.assemble, shared, node)
        except Exception:  # Envoy's protos refuse it: the sidecar keeps what it has
            log.exception(
                "cannot compile the sidecar's configuration",
                extra={"cluster": node.cluster, "instance": node.instance},
            )
            return None

    def assemble(self, shared: SharedBuild, node: SidecarNode, *, build: bool = True) -> Compiled:
        """One sidecar's resources from the shared pieces (built on a miss only; without
        ``build``, a miss raises :class:`Miss`)."""
        inp, policy = shared.inp, shared.policy

        def cache(key: Hashable, make: Callable[[], list[Entry]]) -> tuple[Entry, ...]:
            return self.cache.get(key, make, build=build)

        def authz() -> mesh_authz.InboundAuthz:
            return sidecar_xds.inbound_authz(inp, node)

        app = cache(("app", node.app_port), lambda: [
            entry(CLUSTER_TYPE, sidecar_xds.app_cluster(node.app_port))
        ])  # fmt: skip
        authz_clusters = cache(("authz", policy, node.namespace), lambda: [
            entry(CLUSTER_TYPE, c) for c in authz().clusters
        ])  # fmt: skip
        inbound_routes = cache(("inbound", policy, node.namespace), lambda: [
            entry(ROUTE_TYPE, sidecar_xds.inbound_routes(authz()))
        ])  # fmt: skip
        outbound_routes = cache(("routes", shared.services, node.namespace), lambda: [
            entry(ROUTE_TYPE, sidecar_xds.outbound_routes(inp, node))
        ])  # fmt: skip
        shape = (node.namespace, node.service, node.inbound_host, node.inbound_port,
                 node.outbound_port)  # fmt: skip
        # Listeners depend on the policy, the namespace and service, and their
        # addresses (the shape): parsed once per namespace and service, then copied
        # with each sidecar's own addresses.
        template = (policy, node.namespace, node.service)
        listeners = cache(("listeners", policy, shape), lambda: [
            self.templates.entry(
                LISTENER_TYPE, ("inbound", *template),
                lambda: sidecar_xds.inbound_listener(inp, node),
                node.inbound_host, node.inbound_port,
            ),
            self.templates.entry(
                LISTENER_TYPE, ("outbound", *template),
                lambda: sidecar_xds.outbound_listener(inp, node),
                "127.0.0.1", node.outbound_port,
            ),
        ])  # fmt: skip
        # The sequences sidecars share are the same objects (their joined bytes are
        # made once: wire.Bodies): a namespace's clusters and routes, the endpoints.
        clusters = shared.joined(
            ("cds", app, authz_clusters), (*app, *authz_clusters, *shared.outbound)
        )
        routes = shared.joined(
            ("rds", outbound_routes, inbound_routes), (*outbound_routes, *inbound_routes)
        )
        resources: dict[str, Sequence[Entry]] = {
            SECRET_TYPE: shared.secrets,
            CLUSTER_TYPE: clusters,
            LISTENER_TYPE: listeners,
            ROUTE_TYPE: routes,
            ENDPOINT_TYPE: shared.assignments,
        }  # fmt: skip
        self.assembled += 1
        versions = {
            CLUSTER_TYPE: f"{shared.clusters}.{node.app_port}.{shared.digest(authz_clusters)}",
            ENDPOINT_TYPE: shared.placement,
            SECRET_TYPE: shared.serial,
            LISTENER_TYPE: policy,
            ROUTE_TYPE: f"{policy}.{shared.services}",
        }
        return Compiled(shared.version, resources, (), shared.serial, versions, shared.seq)


@dataclass(eq=False)
class Attached:
    """One sidecar stream served here (see :meth:`SidecarStreams.attach`).

    Its inbox holds, in order, the client's requests, the configurations the
    pusher hands it, a :class:`Revocation` when its credentials stop holding,
    and None when the client ended the stream.
    """

    node: SidecarNode
    admitted: Admitted
    inbox: asyncio.Queue[object] = field(default_factory=asyncio.Queue)


@dataclass(frozen=True)
class SharedBuild:
    """One cluster's sidecar input at one revision, and what all its sidecars share."""

    inp: sidecar_xds.SidecarInput
    bundle: tuple[str, ...]
    version: str  # the input's digest
    policy: str  # what listeners and inbound routes depend on (sidecar_xds.policy_digest)
    serial: str  # the trust bundle's digest
    secrets: tuple[Entry, ...]
    outbound: tuple[Entry, ...]  # every service's cluster (and the tracer's)
    assignments: tuple[Entry, ...]  # every service's endpoints (EDS)
    services: str  # digest of the service names (the outbound routes')
    clusters: str  # digest of what the shared clusters are made from (their type's version)
    placement: str  # digest of every service's endpoints (the assignments' version)
    seq: int = 0  # which build of the cluster this is (later is newer)
    #: the configuration of each sidecar streaming here when it was built
    prepared: dict[SidecarNode, Compiled] = field(default_factory=dict)
    #: sequences of entries several sidecars share, by what they are made of
    _joined: dict[Hashable, tuple[Entry, ...]] = field(default_factory=dict)

    def digest(self, entries: tuple[Entry, ...]) -> str:
        """What ``entries`` hold, as a short digest (of their bytes; once per tuple)."""
        key = ("digest", entries)
        found = self._joined.get(key)
        if found is None:
            made = hashlib.sha256(b"".join(data for _, data in entries)).hexdigest()[:12]
            found = self._joined.setdefault(key, (("", made.encode()),))
        return found[0][1].decode()

    def joined(self, key: Hashable, entries: tuple[Entry, ...]) -> tuple[Entry, ...]:
        """The one ``entries`` object every sidecar whose pieces are ``key`` is sent
        (their response bodies are joined once). ``key`` holds the pieces' own
        tuples, which the cache hands out while it keeps them."""
        return self._joined.setdefault(key, entries)


def sidecar_collector(settings: tracing_settings.TracingSettings) -> JsonDict:
    """The tracer's collector cluster, as every sidecar of the cluster has it."""
    return tracing_settings.collector_cluster(settings)
