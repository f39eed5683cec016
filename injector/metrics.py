"""The injector's Prometheus metrics, in a registry of its own (one process, no workers)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest


class InjectorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reviews = Counter(
            "meshplane_injector_reviews",
            "AdmissionReviews answered, by result (injected, skipped, unsafe, refused)"
            " and reason (docs/injector.md).",
            ["result", "reason"],
            registry=self.registry,
        )
        self.tls_reloads = Gauge(
            "meshplane_injector_tls_reloads",
            "Times the webhook's certificate was re-read from its files since start.",
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
