"""What every subscribed service instance has applied, and when we heard from it.

"Has my change reached the proxies?" must not be answered with a confident
*yes* by an instance that silently went away. So:

- every subscriber sends a keep-alive on its stream every few seconds
  (``meshplane.distribution_client.HEARTBEAT_SECONDS``), and gRPC keepalive
  pings close a half-open connection; each answer, ACK, NACK or keep-alive
  counts as contact;
- an instance is **stale** when it has not been heard from for
  ``stale_after`` seconds, connected or not (a stream can look open for
  minutes after the peer died);
- rows not heard from for ``forget_after`` seconds are dropped, so restarted
  instances (a new ``hostname-pid`` each time) do not pile up.

A stream that replaces an older one of the same instance (a reconnect racing
the old stream's teardown) owns the row: the old stream's late "disconnected"
is ignored, by comparing the stream number each ``connected`` returns.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field, replace

from meshplane.distribution_contract import NodeIdentity
from mgmt_api.domain.times import rfc3339

# An instance that has not been heard from for this long is shown as stale
# (settings: MESHPLANE_DISTRIBUTION_STALE_AFTER).
DEFAULT_STALE_AFTER_SECONDS = 60.0
# Upper bounds (seconds) of the propagation histogram: version sent -> its ACK.
PROPAGATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
# Rows are forgotten after this many stale periods without contact (at least 10 min).
FORGET_AFTER_STALE_PERIODS = 10
MIN_FORGET_AFTER_SECONDS = 600.0


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
    stream: int = 0  # which stream owns the row (see the module docstring)
    sent_at: float | None = None  # when sent_version was sent; None once ACKed or NACKed

    def stale(self, now: float, stale_after: float) -> bool:
        return now - self.last_contact > stale_after

    def to_json(self, now: float, stale_after: float) -> dict[str, object]:
        return {
            "kind": self.node.kind,
            "instance": self.node.instance,
            "connected": self.connected,
            "stale": self.stale(now, stale_after),
            "sentVersion": self.sent_version,
            "appliedVersion": self.applied_version,
            "lastResult": self.last_result,
            "lastError": self.last_error,
            "nackedVersion": self.nacked_version,
            "lastContactTime": rfc3339(round(self.last_contact * 1e6)),
        }


@dataclass
class Propagation:
    """How long versions took from being sent to being ACKed, as histogram counts.

    ``counts[i]`` counts the delays up to ``PROPAGATION_BUCKETS[i]`` (and
    above the previous bound); the last slot counts the longer ones. Fixed
    size, whatever the traffic.
    """

    counts: list[int] = field(default_factory=lambda: [0] * (len(PROPAGATION_BUCKETS) + 1))
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        index = next(
            (i for i, bound in enumerate(PROPAGATION_BUCKETS) if seconds <= bound),
            len(PROPAGATION_BUCKETS),
        )
        self.counts[index] += 1
        self.total += seconds

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, count)`` pairs, cumulative, ending with ``+Inf`` (Prometheus' form)."""
        bounds = [*(f"{b:g}" for b in PROPAGATION_BUCKETS), "+Inf"]
        running = 0
        pairs = []
        for bound, count in zip(bounds, self.counts, strict=True):
            running += count
            pairs.append((bound, running))
        return pairs


@dataclass
class SubscriberRegistry:
    """Thread-safe map of (organization, cluster, kind, instance) → status."""

    stale_after: float = DEFAULT_STALE_AFTER_SECONDS
    forget_after: float | None = None  # None: derived from stale_after
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _instances: dict[tuple[str, str, str, str], InstanceStatus] = field(default_factory=dict)
    _streams: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    # (kind, event) → how many: "sent", "ack", "nack" (the metrics' counters).
    _events: dict[tuple[str, str], int] = field(default_factory=dict)
    # kind -> time from a version's send to its ACK (the metrics' histogram).
    _propagation: dict[str, Propagation] = field(default_factory=dict)

    @property
    def forget_after_seconds(self) -> float:
        if self.forget_after is not None:
            return self.forget_after
        return max(MIN_FORGET_AFTER_SECONDS, FORGET_AFTER_STALE_PERIODS * self.stale_after)

    @staticmethod
    def _key(node: NodeIdentity) -> tuple[str, str, str, str]:
        return (node.organization, node.cluster, node.kind, node.instance)

    def _update(self, node: NodeIdentity, now: float, **changes: object) -> None:
        with self._lock:
            current = self._instances.get(self._key(node)) or InstanceStatus(node, True)
            self._instances[self._key(node)] = replace(current, last_contact=now, **changes)  # type: ignore[arg-type]

    def connected(self, node: NodeIdentity, applied_version: str, now: float) -> int:
        """Record a new stream of ``node``; return its number for :meth:`disconnected`.

        Also drops long-gone rows, so a registry nobody reads stays bounded."""
        self.prune(now)
        stream = next(self._streams)
        self._update(node, now, connected=True, applied_version=applied_version, stream=stream)
        return stream

    def disconnected(self, node: NodeIdentity, now: float, stream: int | None = None) -> None:
        """The stream ``stream`` ended; ignored if a newer stream of the node owns the row."""
        with self._lock:
            current = self._instances.get(self._key(node))
            if current is None or (stream is not None and current.stream != stream):
                return
            self._instances[self._key(node)] = replace(current, connected=False, last_contact=now)

    def heartbeat(self, node: NodeIdentity, now: float) -> None:
        """A keep-alive: contact only, the ACK/NACK state stays as it was."""
        self._update(node, now)

    def _count(self, node: NodeIdentity, event: str) -> None:
        with self._lock:
            key = (node.kind, event)
            self._events[key] = self._events.get(key, 0) + 1

    def events(self) -> dict[tuple[str, str], int]:
        """(kind, "sent" | "ack" | "nack") → count since start."""
        with self._lock:
            return dict(self._events)

    def propagation(self) -> dict[str, Propagation]:
        """kind → a copy of its send-to-ACK histogram."""
        with self._lock:
            return {
                kind: Propagation(list(p.counts), p.total) for kind, p in self._propagation.items()
            }

    def all_instances(self) -> list[InstanceStatus]:
        with self._lock:
            return list(self._instances.values())

    def sent(self, node: NodeIdentity, version: str, now: float) -> None:
        self._count(node, "sent")
        self._update(node, now, sent_version=version, sent_at=now)

    def acked(self, node: NodeIdentity, version: str, now: float) -> None:
        """Record the ACK; if it answers the version last sent, observe how long it took."""
        self._count(node, "ack")
        with self._lock:
            current = self._instances.get(self._key(node))
            if (
                current is not None
                and current.sent_at is not None
                and current.sent_version == version
            ):
                propagation = self._propagation.setdefault(node.kind, Propagation())
                propagation.observe(max(0.0, now - current.sent_at))
        self._update(
            node,
            now,
            applied_version=version,
            last_result="ACK",
            last_error="",
            nacked_version="",
            sent_at=None,
        )

    def nacked(
        self, node: NodeIdentity, kept_version: str, rejected: str, error: str, now: float
    ) -> None:
        self._count(node, "nack")
        self._update(
            node,
            now,
            sent_at=None,
            applied_version=kept_version,
            last_result="NACK",
            last_error=error[:2000],
            nacked_version=rejected,
        )

    def prune(self, now: float) -> int:
        """Drop rows not heard from for ``forget_after_seconds``; return how many."""
        limit = self.forget_after_seconds
        with self._lock:
            old = [k for k, s in self._instances.items() if now - s.last_contact > limit]
            for key in old:
                del self._instances[key]
        return len(old)

    def for_cluster(
        self, organization: str, cluster: str, now: float | None = None
    ) -> list[InstanceStatus]:
        """The cluster's instances (long-gone ones pruned first when ``now`` is given)."""
        if now is not None:
            self.prune(now)
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
