"""The distribution plane inside ``mgmt-api serve``: gRPC server, feed, status.

It runs in the same event loop as the REST app (started and stopped by the
FastAPI lifespan), so a committed REST write reaches the open snapshot
streams without any broker: the write's worker thread hands the new store
revision to :meth:`Distribution.committed`, which wakes the
:class:`~mgmt_api.distribution.feed.ChangeFeed` on the loop. Writes made by
other replicas are picked up by the feed's store poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import grpc
from sqlalchemy.engine import Engine

from meshplane.distribution_client import NodeIdentity
from meshplane.proto.distribution.v1 import distribution_pb2_grpc as pb_grpc
from mgmt_api.distribution.feed import ChangeFeed
from mgmt_api.distribution.registry import SubscriberRegistry
from mgmt_api.distribution.server import KINDS, DistributionServicer
from mgmt_api.distribution.store_backend import StoreBackend, cluster_fqn
from mgmt_api.store import repo
from mgmt_api.store.engine import read_tx

log = logging.getLogger(__name__)

STORE_POLL_SECONDS = 1.0


class Distribution:
    """Owns the ``PolicyDistribution`` server and the subscriber registry."""

    def __init__(self, engine: Engine, listen: str) -> None:
        self._engine = engine
        self.listen = listen
        self.backend = StoreBackend(engine)
        self.registry = SubscriberRegistry()
        self.feed: ChangeFeed | None = None
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: grpc.aio.Server | None = None
        self._poller: asyncio.Task[None] | None = None

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
            self.backend.build, self.backend.authenticate, self.feed, self.registry
        )
        server = grpc.aio.server()
        pb_grpc.add_PolicyDistributionServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
        port = server.add_insecure_port(self.listen)
        if port == 0:
            raise OSError(f"cannot listen for gRPC on {self.listen}")
        await server.start()
        self._server, self.port = server, port
        self._poller = asyncio.create_task(self.feed.poll_store(STORE_POLL_SECONDS))
        host = self.listen.rpartition(":")[0]
        log.info("policy distribution listening", extra={"address": f"{host}:{port}"})

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

    def cluster_status(self, organization: str, cluster: str) -> dict[str, Any]:
        """Per instance: applied version, ACK/NACK, last contact, stale; plus the
        version each service kind should have, so "up to date" is answerable."""
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
        now = time.time()
        instances = []
        for status in self.registry.for_cluster(organization, cluster):
            view = status.to_json(now, self.registry.stale_after)
            view["upToDate"] = status.applied_version == desired.get(status.node.kind)
            instances.append(view)
        out: dict[str, Any] = {
            "cluster": cluster_fqn(organization, cluster),
            "desiredVersions": desired,
            "instances": instances,
        }
        if errors:
            out["compileErrors"] = errors
        return out
