"""The ``PolicyDistribution`` servicer: state-of-the-world snapshots per node.

One stream per service instance. The servicer authenticates the stream,
checks that the node's cluster is the one its credentials belong to (so a
subscriber never sees another cluster's policies), sends the current
snapshot, and sends a new one whenever the change feed moves and the
compiled content differs. ACKs, NACKs and keep-alives update the registry.

Each wake-up (a store change, or ``heartbeat`` seconds without one) first
asks ``still_admitted`` whether the credentials the stream was opened with
still hold: a revoked key or a deleted cluster ends the stream with
PERMISSION_DENIED instead of streaming policies (and their inline secrets)
until the subscriber happens to reconnect. A deleted cluster's rows are
dropped from the registry too.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from meshplane.distribution_contract import SERVICE_KINDS, NodeIdentity
from meshplane.proto.distribution.v1 import distribution_pb2 as pb
from meshplane.proto.distribution.v1 import distribution_pb2_grpc as pb_grpc
from mgmt_api.distribution.feed import ChangeFeed, SharedBuilds
from mgmt_api.service.enforcement import Snapshot, UnknownCluster
from mgmt_api.service.instances import SubscriberRegistry
from mgmt_api.service.stream_auth import AuthError, Revocation

log = logging.getLogger(__name__)


# (bearer token, node) → a grant (the key id), or raise AuthError.
Authenticate = Callable[[str, NodeIdentity], Awaitable[str]]
# (grant, node) → None while the grant holds, else why it no longer does.
StillAdmitted = Callable[[str, NodeIdentity], Awaitable[Revocation | None]]
# node → the compiled snapshot for it.
Build = Callable[[NodeIdentity], Awaitable[Snapshot]]


class DistributionServicer(pb_grpc.PolicyDistributionServicer):
    """Serves snapshots built by ``build`` to nodes ``authenticate`` admits."""

    def __init__(
        self,
        build: Build,
        authenticate: Authenticate,
        feed: ChangeFeed,
        registry: SubscriberRegistry,
        *,
        clock: Callable[[], float] = time.time,
        heartbeat: float = 30.0,
        still_admitted: StillAdmitted | None = None,
    ) -> None:
        self._build = build
        self._authenticate = authenticate
        self._still_admitted = still_admitted
        self._feed = feed
        self._registry = registry
        self._clock = clock
        self._heartbeat = heartbeat
        self._nonces = itertools.count(1)
        # One build per (kind, organization, cluster) and revision.
        self._builds: SharedBuilds[tuple[str, str, str], Snapshot] = SharedBuilds(
            feed, self._build_for
        )

    async def _build_for(self, key: tuple[str, str, str]) -> Snapshot:
        kind, organization, cluster = key
        return await self._build(NodeIdentity(kind, organization, cluster, ""))

    async def _shared_build(self, node: NodeIdentity, revision: int) -> Snapshot:
        return await self._builds.get((node.kind, node.organization, node.cluster), revision)

    async def _admit(
        self,
        first: pb.SnapshotRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> tuple[NodeIdentity, str]:
        node = first.node
        if node.kind not in SERVICE_KINDS or not node.organization or not node.cluster:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the first request needs node.kind in {SERVICE_KINDS}, "
                "node.organization and node.cluster",
            )
        identity = NodeIdentity(
            node.kind, node.organization, node.cluster, node.instance or context.peer()
        )
        metadata = dict(context.invocation_metadata() or ())
        header = str(metadata.get("authorization", ""))
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "a bearer token is required")
        try:
            grant = await self._authenticate(token.strip(), identity)
        except AuthError as exc:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        return identity, grant

    async def StreamSnapshots(
        self,
        request_iterator: AsyncIterator[pb.SnapshotRequest],
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> AsyncIterator[pb.Snapshot]:
        try:
            first = await anext(aiter(request_iterator))
        except StopAsyncIteration:
            return
        node, grant = await self._admit(first, context)
        # Headers now, not with the first snapshot (there is none when the
        # subscriber already runs the current version): they tell it the
        # stream was admitted.
        await context.send_initial_metadata(())
        stream = self._registry.connected(node, first.version_info, self._clock())
        log.info(
            "subscriber connected",
            extra={"kind": node.kind, "cluster": node.cluster, "instance": node.instance},
        )
        sent: dict[str, str] = {}  # nonce → version
        reader = asyncio.create_task(self._read_answers(node, request_iterator, sent))
        last_version = first.version_info
        revoked: Revocation | None = None
        try:
            while True:
                revision = self._feed.revision
                try:
                    compiled = await self._shared_build(node, revision)
                except UnknownCluster:
                    revoked = Revocation("the cluster was deleted", cluster_gone=True)
                    break
                # Checked after the build: a cluster deleted before the build
                # read the store compiles to an empty snapshot (no limits, no
                # policies), which must never be sent; this check sees that
                # deletion too.
                if self._still_admitted is not None:
                    revoked = await self._still_admitted(grant, node)
                    if revoked is not None:
                        break
                if compiled.version != last_version:
                    nonce = str(next(self._nonces))
                    sent[nonce] = compiled.version
                    self._registry.sent(node, compiled.version, self._clock())
                    yield pb.Snapshot(
                        version_info=compiled.version,
                        nonce=nonce,
                        kind=node.kind,
                        files=[
                            pb.ConfigFile(name=name, content=content)
                            for name, content in sorted(compiled.files.items())
                        ],
                    )
                    last_version = compiled.version
                if reader.done():
                    break
                waiter = asyncio.create_task(self._feed.wait_beyond(revision, self._heartbeat))
                await asyncio.wait({waiter, reader}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if reader.done():
                    break
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            self._registry.disconnected(node, self._clock(), stream)
            if revoked is not None and revoked.cluster_gone:
                self._registry.forget_cluster(node.organization, node.cluster)
            log.info(
                "subscriber disconnected",
                extra={"kind": node.kind, "cluster": node.cluster, "instance": node.instance},
            )
        if revoked is not None:
            log.warning(
                "stream closed: its credentials no longer hold",
                extra={
                    "cluster": node.cluster,
                    "instance": node.instance,
                    "reason": revoked.reason,
                },
            )
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, revoked.reason)

    async def _read_answers(
        self,
        node: NodeIdentity,
        requests: AsyncIterator[pb.SnapshotRequest],
        sent: dict[str, str],
    ) -> None:
        async for answer in requests:
            now = self._clock()
            if not answer.response_nonce:
                # A keep-alive: the subscriber is alive and runs version_info.
                # It answers no snapshot, so it must not overwrite an ACK/NACK.
                self._registry.heartbeat(node, now)
                continue
            rejected = sent.pop(answer.response_nonce, "")
            if answer.HasField("error_detail"):
                self._registry.nacked(
                    node, answer.version_info, rejected, answer.error_detail.message, now
                )
                log.warning(
                    "snapshot NACKed",
                    extra={
                        "cluster": node.cluster,
                        "instance": node.instance,
                        "version": rejected,
                        "error": answer.error_detail.message[:500],
                    },
                )
            else:
                self._registry.acked(node, answer.version_info, now)
