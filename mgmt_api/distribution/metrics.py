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

Labels are bounded (kinds and fixed states), never instance names. Every
kind's ``events_total`` and ``nacking_instances`` series exist at 0 from the
first scrape (``KINDS`` x ``EVENTS``), so ``increase()`` counts the first
NACK and an alert on them has a series to evaluate.
"""

from __future__ import annotations

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
from mgmt_api.service.instances import Propagation, SubscriberRegistry

KINDS: tuple[str, ...] = (*SERVICE_KINDS, GATEWAY_KIND)
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
