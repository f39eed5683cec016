"""Prometheus view of the distribution plane: who is subscribed, and what they did.

Read from the registry the status views read (:mod:`mgmt_api.service.instances`)
at scrape time, so the figures and ``GET .../status`` never disagree and the
streams pay nothing per message:

- ``mgmt_api_distribution_instances{kind, state}``: instances (ratelimit and
  extauthz on the policy stream, gateways on ADS) by ``connected``,
  ``stale`` (connected, but not heard from within the stale period) and
  ``disconnected`` (remembered until forgotten);
- ``mgmt_api_distribution_nacking_instances{kind}``: instances whose last
  answer was a NACK (alert on it: they run an older configuration);
- ``mgmt_api_distribution_events_total{kind, event}``: versions sent, ACKs
  and NACKs since the process started;
- ``mgmt_api_distribution_propagation_seconds{kind}``: a histogram of the
  time from sending a version to an instance to that instance's ACK of it
  (on this replica: the one holding the instance's stream).

Every kind's ``events_total`` and ``nacking_instances`` series exist at 0
from the first scrape (``KINDS`` x ``EVENTS``), so ``increase()`` counts the
first NACK and an alert on them has a series to evaluate.
Labels are bounded (kinds and fixed states), never instance names, except in
:class:`SidecarCertificateCollector`'s one gauge, which the shipped alert
rules need per sidecar (bounded by the sidecars a replica admits per cluster,
:data:`~mgmt_api.service.sidecars.MAX_SIDECARS_PER_CLUSTER`).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from meshplane.distribution_contract import SERVICE_KINDS
from meshplane.gateway_contract import GATEWAY_KIND
from meshplane.sidecar_contract import SIDECAR_KIND
from mgmt_api.service.instances import Propagation, SubscriberRegistry
from mgmt_api.service.sidecars import SidecarDirectory

KINDS: tuple[str, ...] = (*SERVICE_KINDS, GATEWAY_KIND, SIDECAR_KIND)
EVENTS = ("sent", "ack", "nack")


class DistributionCollector(Collector):
    def __init__(
        self, registry: SubscriberRegistry, clock: Callable[[], float] = time.time
    ) -> None:
        self._registry = registry
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        now = self._clock()
        states: Counter[tuple[str, str]] = Counter()
        nacking: Counter[str] = Counter(dict.fromkeys(KINDS, 0))
        for status in self._registry.all_instances():
            if not status.connected:
                state = "disconnected"
            elif status.stale(now, self._registry.stale_after):
                state = "stale"
            else:
                state = "connected"
            states[(status.node.kind, state)] += 1
            if status.last_result == "NACK":
                nacking[status.node.kind] += 1
        instances = GaugeMetricFamily(
            "mgmt_api_distribution_instances",
            "Subscribed instances (policy stream and gateway ADS) by kind and state",
            labels=["kind", "state"],
        )
        for (kind, state), count in sorted(states.items()):
            instances.add_metric([kind, state], count)
        yield instances
        nacks = GaugeMetricFamily(
            "mgmt_api_distribution_nacking_instances",
            "Instances whose last answer was a NACK (they run an older configuration)",
            labels=["kind"],
        )
        for kind, count in sorted(nacking.items()):
            nacks.add_metric([kind], count)
        yield nacks
        events = CounterMetricFamily(
            "mgmt_api_distribution_events",
            "Configuration versions sent, and the ACKs and NACKs they got",
            labels=["kind", "event"],
        )
        counts = {(kind, event): 0 for kind in KINDS for event in EVENTS}
        counts.update(self._registry.events())
        for (kind, event), count in sorted(counts.items()):
            events.add_metric([kind, event], count)
        yield events
        propagation = HistogramMetricFamily(
            "mgmt_api_distribution_propagation_seconds",
            "Time from sending a configuration version to an instance to its ACK",
            labels=["kind"],
        )
        observed = self._registry.propagation()
        for kind in sorted({*KINDS, *observed}):
            histogram = observed.get(kind) or Propagation()
            propagation.add_metric([kind], histogram.cumulative(), histogram.total)
        yield propagation


class SidecarCertificateCollector(Collector):
    """``meshplane_sidecar_certificate_expiry_timestamp_seconds{cluster, instance}``.

    The notAfter (Unix seconds) of the workload certificate last signed
    (``WorkloadCertificates/Sign``) for each sidecar connected here
    (docs/mesh.md); ``cluster`` is ``ORG/CLUSTER``. Read from the sidecar
    directory at scrape time; a closed stream's series is gone with it, so a
    certificate nobody uses cannot raise the alert.
    """

    def __init__(self, directory: SidecarDirectory) -> None:
        self._directory = directory

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "meshplane_sidecar_certificate_expiry_timestamp_seconds",
            "When the workload certificate a connected sidecar holds expires (Unix seconds)",
            labels=["cluster", "instance"],
        )
        for node, not_after in sorted(
            self._directory.expiries(), key=lambda e: (e[0].node_cluster, e[0].instance)
        ):
            gauge.add_metric([node.node_cluster, node.instance], not_after)
        yield gauge


class AttestationCounts(Collector):
    """``mgmt_api_workload_certificates_total{outcome, reason}``: Sign's answers.

    ``outcome`` is ``issued`` or ``refused``; ``reason`` a refusal's bounded
    label (:mod:`mgmt_api.domain.workload_attest`), ``""`` for an issue.
    Sidecar ADS refusals count under ``mgmt_api_sidecar_admissions_total``
    with the same reasons.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._signs: Counter[tuple[str, str]] = Counter({("issued", ""): 0})
        self._admissions: Counter[tuple[str, str]] = Counter({("admitted", ""): 0})

    def issued(self) -> None:
        with self._lock:
            self._signs["issued", ""] += 1

    def refused(self, reason: str) -> None:
        with self._lock:
            self._signs["refused", reason] += 1

    def admission(self, reason: str = "") -> None:
        """A sidecar stream admitted (``reason`` empty) or refused."""
        with self._lock:
            self._admissions["refused" if reason else "admitted", reason] += 1

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            signs, admissions = dict(self._signs), dict(self._admissions)
        for name, doc, counts in (
            (
                "mgmt_api_workload_certificates",
                "Workload certificate requests (Sign), issued or refused by reason",
                signs,
            ),
            (
                "mgmt_api_sidecar_admissions",
                "Sidecar ADS streams admitted, or refused by reason",
                admissions,
            ),
        ):
            family = CounterMetricFamily(name, doc, labels=["outcome", "reason"])
            for (outcome, reason), count in sorted(counts.items()):
                family.add_metric([outcome, reason], count)
            yield family
