"""The sidecar half of the ADS server (:mod:`mgmt_api.distribution.ads`).

Sidecars share the gateway's ADS protocol handling and differ in three ways,
all kept here:

- their resources come from :func:`mgmt_api.compiler.sidecar_xds.compile_sidecar`;
- their input depends on which sidecars are connected (the endpoints), not
  only on the store, so their streams follow their OWN change feed, moved by
  the store's feed and by every join or leave of the
  :class:`~mgmt_api.service.sidecars.SidecarDirectory` (the store's revision
  numbers cannot be bumped locally: another replica's writes would then be
  missed);
- a sidecar joins the directory while its stream is open.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from meshplane.sidecar_contract import SidecarNode
from mgmt_api.compiler import sidecar_xds
from mgmt_api.compiler.gateway_xds import GatewayResources
from mgmt_api.distribution.feed import ChangeFeed, SharedBuilds
from mgmt_api.distribution.streams import StillAdmitted, StreamPlane
from mgmt_api.service.enforcement import UnknownCluster
from mgmt_api.service.instances import SubscriberRegistry
from mgmt_api.service.sidecars import SidecarDirectory

log = logging.getLogger(__name__)

# (organization, cluster) → the cluster's sidecar input.
SidecarBuild = Callable[[tuple[str, str]], Awaitable[sidecar_xds.SidecarInput]]


class SidecarStreams:
    """What every sidecar stream of one ADS server shares (see the module docstring)."""

    def __init__(
        self,
        build: SidecarBuild,
        directory: SidecarDirectory,
        store_feed: ChangeFeed,
        registry: SubscriberRegistry,
        *,
        still_admitted: StillAdmitted | None = None,
        clock: Callable[[], float] = time.time,
        heartbeat: float = 30.0,
    ) -> None:
        self.directory = directory
        self.feed = ChangeFeed()
        self.plane = StreamPlane(self.feed, registry, still_admitted, clock, heartbeat)
        self._store_feed = store_feed
        self._builds: SharedBuilds[tuple[str, str], sidecar_xds.SidecarInput] = SharedBuilds(
            self.feed, build
        )
        directory.listeners.append(self._moved)

    def _moved(self) -> None:
        self.feed.notify()

    async def follow_store(self) -> None:
        """Move the sidecar feed whenever the store's moves; cancel to stop."""
        seen = self._store_feed.revision
        while True:
            seen = await self._store_feed.wait_beyond(seen)
            self.feed.notify()

    def start(self) -> asyncio.Task[None]:
        return asyncio.create_task(self.follow_store())

    async def compile(
        self, node: SidecarNode, revision: int
    ) -> tuple[str, GatewayResources] | None:
        """(version, resources) of this sidecar at ``revision``; None when they cannot compile."""
        try:
            inp = await self._builds.get((node.organization, node.cluster), revision)
            return inp.version(), sidecar_xds.compile_sidecar(inp, node)
        except UnknownCluster:
            raise
        except Exception:
            log.exception(
                "cannot compile the sidecar's configuration",
                extra={"cluster": node.cluster, "instance": node.instance},
            )
            return None
