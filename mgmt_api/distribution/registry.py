"""What every subscribed service instance has applied, and when we heard from it."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace

from meshplane.distribution_client import NodeIdentity

# An instance that has not been heard from for this long is shown as stale.
DEFAULT_STALE_AFTER_SECONDS = 60.0


@dataclass(frozen=True)
class InstanceStatus:
    """One subscriber as the management plane last saw it."""

    node: NodeIdentity
    connected: bool
    sent_version: str = ""
    applied_version: str = ""
    last_result: str = ""  # "ACK" | "NACK" | ""
    last_error: str = ""
    nacked_version: str = ""
    last_contact: float = 0.0

    def to_json(self, now: float, stale_after: float) -> dict[str, object]:
        stale = not self.connected and now - self.last_contact > stale_after
        return {
            "kind": self.node.kind,
            "instance": self.node.instance,
            "connected": self.connected,
            "stale": stale,
            "sentVersion": self.sent_version,
            "appliedVersion": self.applied_version,
            "lastResult": self.last_result,
            "lastError": self.last_error,
            "nackedVersion": self.nacked_version,
            "lastContactTime": self.last_contact,
        }


@dataclass
class SubscriberRegistry:
    """Thread-safe map of (organization, cluster, kind, instance) → status."""

    stale_after: float = DEFAULT_STALE_AFTER_SECONDS
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _instances: dict[tuple[str, str, str, str], InstanceStatus] = field(default_factory=dict)

    @staticmethod
    def _key(node: NodeIdentity) -> tuple[str, str, str, str]:
        return (node.organization, node.cluster, node.kind, node.instance)

    def _update(self, node: NodeIdentity, now: float, **changes: object) -> None:
        with self._lock:
            current = self._instances.get(self._key(node)) or InstanceStatus(node, True)
            self._instances[self._key(node)] = replace(current, last_contact=now, **changes)  # type: ignore[arg-type]

    def connected(self, node: NodeIdentity, applied_version: str, now: float) -> None:
        self._update(node, now, connected=True, applied_version=applied_version)

    def disconnected(self, node: NodeIdentity, now: float) -> None:
        self._update(node, now, connected=False)

    def sent(self, node: NodeIdentity, version: str, now: float) -> None:
        self._update(node, now, sent_version=version)

    def acked(self, node: NodeIdentity, version: str, now: float) -> None:
        self._update(
            node, now, applied_version=version, last_result="ACK", last_error="", nacked_version=""
        )

    def nacked(
        self, node: NodeIdentity, kept_version: str, rejected: str, error: str, now: float
    ) -> None:
        self._update(
            node,
            now,
            applied_version=kept_version,
            last_result="NACK",
            last_error=error[:2000],
            nacked_version=rejected,
        )

    def for_cluster(self, organization: str, cluster: str) -> list[InstanceStatus]:
        with self._lock:
            return sorted(
                (
                    s
                    for (org, c, _, _), s in self._instances.items()
                    if org == organization and c == cluster
                ),
                key=lambda s: (s.node.kind, s.node.instance),
            )

    def forget_cluster(self, organization: str, cluster: str) -> None:
        with self._lock:
            for key in [k for k in self._instances if k[:2] == (organization, cluster)]:
                del self._instances[key]
