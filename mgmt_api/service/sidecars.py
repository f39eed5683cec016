"""Which sidecars are connected to this replica, and where the others reach them.

A sidecar's ADS stream joins it on admission and leaves on close; the
sidecar compiler makes each service's endpoints from what is here. It lives
in memory per replica (like the status registry): with several replicas, a
sidecar sees the instances connected to the replica it streams from
(docs/mesh.md, "what is not done"). Every change calls the listeners, so the
streams of the cluster recompile.

It also holds when the certificate last signed for each pod expires
(:meth:`SidecarDirectory.issued`, told by ``WorkloadCertificates/Sign`` with
the VERIFIED pod, so no caller can set another's), which the
``meshplane_sidecar_certificate_expiry_timestamp_seconds`` gauge reads at
scrape time for the sidecars connected here (each joined with its verified
pod): a sidecar that leaves takes its series with it, and a certificate
nobody streams with raises no alert.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from meshplane.sidecar_contract import SidecarNode
from mgmt_api.compiler.sidecar_xds import SidecarEndpoint

#: Cap on the sidecars one cluster may register here (each is an endpoint every
#: sidecar of the cluster receives): past it, a new stream is refused.
MAX_SIDECARS_PER_CLUSTER = 4096
#: Pods whose last certificate expiry is remembered (oldest forgotten).
MAX_EXPIRIES = 65_536


class DirectoryFull(RuntimeError):
    """The cluster already has :data:`MAX_SIDECARS_PER_CLUSTER` sidecars here."""


class SidecarDirectory:
    """Thread-safe (organization, cluster) → {stream id → node}."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[tuple[str, str], dict[int, SidecarNode]] = {}
        self._pods: dict[int, str] = {}  # handle → its verified pod ("NS/NAME/UID")
        # (organization, cluster, pod) → notAfter of its last signed certificate
        self._expiry: OrderedDict[tuple[str, str, str], float] = OrderedDict()
        self._ids = 0
        self.listeners: list[Callable[[], None]] = []

    def _changed(self) -> None:
        for listener in list(self.listeners):
            listener()

    def join(self, node: SidecarNode, pod: str = "") -> int:
        """Register a connected sidecar of the verified ``pod``; the id to :meth:`leave` with."""
        with self._lock:
            nodes = self._nodes.setdefault((node.organization, node.cluster), {})
            if len(nodes) >= MAX_SIDECARS_PER_CLUSTER:
                raise DirectoryFull(f"{MAX_SIDECARS_PER_CLUSTER} sidecars already connected")
            self._ids += 1
            nodes[self._ids] = node
            handle = self._ids
            self._pods[handle] = pod
        self._changed()
        return handle

    def leave(self, node: SidecarNode, handle: int) -> None:
        with self._lock:
            nodes = self._nodes.get((node.organization, node.cluster), {})
            nodes.pop(handle, None)
            self._pods.pop(handle, None)
            if not nodes:
                self._nodes.pop((node.organization, node.cluster), None)
        self._changed()

    def issued(self, organization: str, cluster: str, pod: str, not_after: float) -> None:
        """A certificate valid until ``not_after`` (Unix s) was signed for the verified ``pod``."""
        key = (organization, cluster, pod)
        with self._lock:
            self._expiry[key] = not_after
            self._expiry.move_to_end(key)
            while len(self._expiry) > MAX_EXPIRIES:
                self._expiry.popitem(last=False)

    def expiries(self) -> list[tuple[SidecarNode, float]]:
        """(node, notAfter) of every connected sidecar whose pod a certificate was signed for."""
        with self._lock:
            return [
                (node, self._expiry[key])
                for (org, cluster), nodes in self._nodes.items()
                for handle, node in nodes.items()
                if (key := (org, cluster, self._pods.get(handle, ""))) in self._expiry
            ]

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
