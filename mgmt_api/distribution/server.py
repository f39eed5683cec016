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

import contextlib
import functools
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import grpc

from meshplane.distribution_contract import SERVICE_KINDS, NodeIdentity
from meshplane.proto.distribution.v1 import distribution_pb2 as pb
from meshplane.proto.distribution.v1 import distribution_pb2_grpc as pb_grpc
from mgmt_api.distribution.feed import ChangeFeed, SharedBuilds
from mgmt_api.distribution.streams import (
    Admitted,
    StillAdmitted,
    StreamPlane,
    admit_bearer,
    follow,
)
from mgmt_api.service.enforcement import Snapshot
from mgmt_api.service.instances import SubscriberRegistry

log = logging.getLogger(__name__)


# (bearer token, node) → a grant (the key id), or raise AuthError.
Authenticate = Callable[[str, NodeIdentity], Awaitable[str]]
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
        self._plane = StreamPlane(feed, registry, still_admitted, clock, heartbeat)
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
        grant = await admit_bearer(context, lambda token: self._authenticate(token, identity))
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
        subscriber = _Subscriber(node, first.version_info)
        snapshots = follow(
            self._plane,
            Admitted(node, grant, context),
            request_iterator,
            version=first.version_info,
            build=lambda revision: self._shared_build(node, revision),
            on_build=functools.partial(self._snapshot, subscriber),
            on_request=functools.partial(self._answered, subscriber),
        )
        async with contextlib.aclosing(snapshots):
            async for snapshot in snapshots:
                yield snapshot

    def _snapshot(self, subscriber: _Subscriber, compiled: Snapshot) -> Sequence[pb.Snapshot]:
        """The snapshot to send when the build's version is not the subscriber's."""
        if compiled.version == subscriber.last_version:
            return ()
        nonce = str(next(self._nonces))
        subscriber.sent[nonce] = compiled.version
        self._plane.registry.sent(subscriber.node, compiled.version, self._plane.clock())
        subscriber.last_version = compiled.version
        return (
            pb.Snapshot(
                version_info=compiled.version,
                nonce=nonce,
                kind=subscriber.node.kind,
                files=[
                    pb.ConfigFile(name=name, content=content)
                    for name, content in sorted(compiled.files.items())
                ],
            ),
        )

    def _answered(
        self, subscriber: _Subscriber, answer: pb.SnapshotRequest
    ) -> Sequence[pb.Snapshot]:
        """An ACK, a NACK or a keep-alive into the registry; nothing is sent for it."""
        node, now = subscriber.node, self._plane.clock()
        if not answer.response_nonce:
            # A keep-alive: the subscriber is alive and runs version_info.
            # It answers no snapshot, so it must not overwrite an ACK/NACK.
            self._plane.registry.heartbeat(node, now)
            return ()
        rejected = subscriber.sent.pop(answer.response_nonce, "")
        if answer.HasField("error_detail"):
            self._plane.registry.nacked(
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
            self._plane.registry.acked(node, answer.version_info, now)
        return ()


@dataclass
class _Subscriber:
    """What one subscriber runs and has been sent."""

    node: NodeIdentity
    last_version: str
    sent: dict[str, str] = field(default_factory=dict)  # nonce → version
