"""Which sidecars are connected, in the registry every replica shares, and when they leave.

A service's endpoints are its sidecars' rows in the store
(:mod:`mgmt_api.store.sidecars`), not the streams one process holds: every
replica serves the same endpoints, and a replica that restarts serves them at
once. When a row goes:

- the sidecar's own stream ended while this replica runs (its client hung
  up or was cancelled, or the pod is gone from the inventory): at once, so
  its callers stop picking it within a push;
- never because a replica stops (SIGTERM: :meth:`SidecarDirectory.closing`)
  or dies (kill -9): its sidecars reconnect to a replica, which rewrites
  their rows; until then they keep serving, and their callers keep them;
- when a row has not been heard from for :data:`STALE_AFTER_SECONDS`
  (longer than Envoy's 30 s reconnect backoff): its replica died and the
  sidecar came back nowhere. Each replica refreshes its streams' rows every
  :data:`REFRESH_SECONDS`; a replica sweeps only once it has itself run for
  a stale period, so one that starts after a long outage does not drop
  sidecars that are still reconnecting.

It also holds, per process, when the certificate last signed for each pod
expires (:meth:`SidecarDirectory.issued`, told by
``WorkloadCertificates/Sign`` with the VERIFIED pod, so no caller can set
another's), which the ``meshplane_sidecar_certificate_expiry_timestamp_seconds``
gauge reads at scrape time for the sidecars connected here: a sidecar that
leaves takes its series with it, and a certificate nobody streams with raises
no alert.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from meshplane.sidecar_contract import SidecarNode
from mgmt_api.compiler.sidecar_xds import SidecarEndpoint
from mgmt_api.store import sidecars as registry
from mgmt_api.store.uow import UnitOfWork

log = logging.getLogger(__name__)

#: Cap on the sidecars one cluster may register (each is an endpoint every
#: sidecar of the cluster receives): past it, a new stream is refused.
MAX_SIDECARS_PER_CLUSTER = 4096
#: Pods whose last certificate expiry is remembered (oldest forgotten).
MAX_EXPIRIES = 65_536
#: How often a replica tells the registry its streams are still open.
REFRESH_SECONDS = 10.0
#: A row unheard for this long is dropped (Envoy's reconnect backoff tops at 30 s).
STALE_AFTER_SECONDS = 90.0


class DirectoryFull(RuntimeError):
    """The cluster already has :data:`MAX_SIDECARS_PER_CLUSTER` sidecars."""


@dataclass(frozen=True)
class _Held:
    node: SidecarNode
    pod: str
    stream: str  # the registry row's owner token


def replica_name() -> str:
    """This process, as the registry's rows name their holder (diagnostics only)."""
    return f"{socket.gethostname()[:40]}-{os.getpid()}"


class SidecarDirectory:
    """This replica's sidecar streams, written through to the shared registry."""

    def __init__(
        self,
        uow: UnitOfWork,
        *,
        replica: str | None = None,
        clock: Callable[[], float] = time.time,
        stale_after: float = STALE_AFTER_SECONDS,
    ) -> None:
        self.uow = uow
        self.replica = replica or replica_name()
        self.stale_after = stale_after
        self._clock = clock
        self._started = clock()
        self._lock = threading.Lock()
        self._held: dict[int, _Held] = {}
        # (organization, cluster, pod) → notAfter of its last signed certificate
        self._expiry: OrderedDict[tuple[str, str, str], float] = OrderedDict()
        self._ids = 0
        self._closing = False
        #: Called (from any thread) after this replica changed the registry.
        self.listeners: list[Callable[[], None]] = []

    def _changed(self) -> None:
        for listener in list(self.listeners):
            listener()

    def closing(self) -> None:
        """This replica is stopping: the streams it drops keep their rows."""
        self._closing = True

    def join(self, node: SidecarNode, pod: str = "") -> int:
        """Register a connected sidecar of the verified ``pod``; the id to :meth:`leave` with.

        Blocking (a store write): call it off the event loop."""
        if registry.count(self.uow, node.organization, node.cluster) >= MAX_SIDECARS_PER_CLUSTER:
            raise DirectoryFull(f"{MAX_SIDECARS_PER_CLUSTER} sidecars already connected")
        held = _Held(node, pod, secrets.token_hex(16))
        endpoint = SidecarEndpoint(
            node.namespace, node.service, node.inbound_host, node.inbound_port,
            node.service_account,
        )  # fmt: skip
        row = registry.SidecarRow(
            node.organization, node.cluster, node.instance, endpoint, pod, held.stream,
            self.replica,
        )  # fmt: skip
        registry.join(self.uow, row, self._clock())
        self._changed()
        with self._lock:
            self._ids += 1
            self._held[self._ids] = held
            return self._ids

    def leave(self, handle: int) -> None:
        """The stream ``handle`` ended. Blocking (a store write unless this replica is closing)."""
        with self._lock:
            held = self._held.pop(handle, None)
        if held is None or self._closing:
            return
        node = held.node
        if registry.leave(self.uow, node.organization, node.cluster, node.instance, held.stream):
            self._changed()

    def refresh(self) -> None:
        """Tell the registry this replica's streams are open; sweep the long-unheard rows."""
        now = self._clock()
        with self._lock:
            streams = [h.stream for h in self._held.values()]
        registry.refresh(self.uow, streams, now)
        if now - self._started >= self.stale_after:
            dropped = registry.sweep(self.uow, now - self.stale_after)
            if dropped:
                self._changed()
                log.info("dropped sidecars no replica has heard from", extra={"count": dropped})

    async def refresh_forever(self, every: float = REFRESH_SECONDS) -> None:
        """:meth:`refresh` every ``every`` seconds; cancel to stop."""
        while True:
            await asyncio.sleep(every)
            try:
                await asyncio.to_thread(self.refresh)
            except Exception:  # the store is down: the next round tries again
                log.exception("cannot refresh the sidecar registry")

    def issued(self, organization: str, cluster: str, pod: str, not_after: float) -> None:
        """A certificate valid until ``not_after`` (Unix s) was signed for the verified ``pod``."""
        key = (organization, cluster, pod)
        with self._lock:
            self._expiry[key] = not_after
            self._expiry.move_to_end(key)
            while len(self._expiry) > MAX_EXPIRIES:
                self._expiry.popitem(last=False)

    def expiries(self) -> list[tuple[SidecarNode, float]]:
        """(node, notAfter) of each sidecar connected here with a certificate signed for its pod."""
        with self._lock:
            return [
                (h.node, self._expiry[key])
                for h in self._held.values()
                if (key := (h.node.organization, h.node.cluster, h.pod)) in self._expiry
            ]

    def endpoints(self, organization: str, cluster: str) -> tuple[SidecarEndpoint, ...]:
        """The cluster's sidecars as endpoints (every replica's), sorted, one per address."""
        return registry.endpoints(self.uow, organization, cluster)
