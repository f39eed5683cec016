"""Which sidecars are connected to this replica, and where the others reach them.

A sidecar's ADS stream joins it on admission and leaves on close; the
sidecar compiler makes each service's endpoints from what is here. It lives
in memory per replica (like the status registry): with several replicas, a
sidecar sees the instances connected to the replica it streams from
(docs/mesh.md, "what is not done"). Every change calls the listeners, so the
streams of the cluster recompile.

It also holds when each connected sidecar's current certificate expires
(:meth:`SidecarDirectory.certified`), which the
``meshplane_sidecar_certificate_expiry_timestamp_seconds`` gauge reads at
scrape time; a sidecar that leaves takes its series with it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from meshplane.sidecar_contract import SidecarNode
from mgmt_api.compiler.sidecar_xds import SidecarEndpoint

#: Cap on the sidecars one cluster may register here (each is an endpoint every
#: sidecar of the cluster receives): past it, a new stream is refused.
MAX_SIDECARS_PER_CLUSTER = 4096


class DirectoryFull(RuntimeError):
    """The cluster already has :data:`MAX_SIDECARS_PER_CLUSTER` sidecars here."""


class SidecarDirectory:
    """Thread-safe (organization, cluster) → {stream id → node}."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[tuple[str, str], dict[int, SidecarNode]] = {}
        self._expiry: dict[int, tuple[SidecarNode, float]] = {}  # handle → (node, notAfter)
        self._ids = 0
        self.listeners: list[Callable[[], None]] = []

    def _changed(self) -> None:
        for listener in list(self.listeners):
            listener()

    def join(self, node: SidecarNode) -> int:
        """Register a connected sidecar; the id to :meth:`leave` with."""
        with self._lock:
            nodes = self._nodes.setdefault((node.organization, node.cluster), {})
            if len(nodes) >= MAX_SIDECARS_PER_CLUSTER:
                raise DirectoryFull(f"{MAX_SIDECARS_PER_CLUSTER} sidecars already connected")
            self._ids += 1
            nodes[self._ids] = node
            handle = self._ids
        self._changed()
        return handle

    def leave(self, node: SidecarNode, handle: int) -> None:
        with self._lock:
            nodes = self._nodes.get((node.organization, node.cluster), {})
            nodes.pop(handle, None)
            self._expiry.pop(handle, None)
            if not nodes:
                self._nodes.pop((node.organization, node.cluster), None)
        self._changed()

    def certified(self, handle: int, not_after: float) -> None:
        """A connected sidecar was sent a certificate valid until ``not_after`` (Unix s)."""
        with self._lock:
            for nodes in self._nodes.values():
                if handle in nodes:
                    self._expiry[handle] = (nodes[handle], not_after)

    def expiries(self) -> list[tuple[SidecarNode, float]]:
        """(node, notAfter) of every connected sidecar that holds a certificate."""
        with self._lock:
            return list(self._expiry.values())

    def endpoints(self, organization: str, cluster: str) -> tuple[SidecarEndpoint, ...]:
        """The cluster's sidecars as endpoints, sorted (one per address)."""
        with self._lock:
            nodes = list(self._nodes.get((organization, cluster), {}).values())
        return tuple(
            sorted(
                {
                    SidecarEndpoint(
                        n.namespace, n.service, n.inbound_host, n.inbound_port, n.service_account
                    )
                    for n in nodes
                }
            )
        )
