"""Envoy's OpenTelemetry tracer, from a Cluster's ``tracing`` settings.

``tracing: {collector: "grpc://host:port", samplingPercentage: 1.0}`` on a
Cluster makes every gateway of the cluster (and, through
:func:`hcm_tracing` and :func:`collector_cluster`, any other Envoy the
compiler configures, such as sidecars) start or continue a W3C trace per
request and export its spans to the collector over OTLP/gRPC:

- the HTTP connection manager's ``tracing`` with
  ``envoy.tracers.opentelemetry`` (which also propagates ``traceparent``
  to the ext_authz and ratelimit gRPC calls and to the upstream);
- ``randomSampling`` is ``samplingPercentage`` (0-100) for requests that
  arrive without a sampling decision (one that arrives with a ``traceparent``
  keeps its flag);
- ``spawnUpstreamSpan``: the upstream call gets its own client span, so a
  slow backend shows as such, not as a slow gateway;
- one STRICT_DNS HTTP/2 cluster (:data:`COLLECTOR_CLUSTER`) to the collector.

Pure: settings in, protojson out. The API validates the settings
(:func:`validate`) when a Cluster is written; the renderer then trusts them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from meshplane.netaddr import parse_service_uri
from mgmt_api.compiler.grpc_cluster import grpc_cluster
from mgmt_api.compiler.protojson import JsonDict

COLLECTOR_CLUSTER = "meshplane_otlp_collector"
TRACER_NAME = "envoy.tracers.opentelemetry"
_TYPE = "type.googleapis.com/"
_OTEL_CONFIG = _TYPE + "envoy.config.trace.v3.OpenTelemetryConfig"
DEFAULT_SAMPLING_PERCENTAGE = 1.0


class StoredTracing(TypedDict, total=False):
    """A Cluster's ``tracing`` as the API stored it (``schemas.resources.ClusterTracing``
    by alias, checked by :func:`validate` on write)."""

    collector: str
    samplingPercentage: float


@dataclass(frozen=True)
class TracingSettings:
    """Where a cluster's Envoys send spans, and the share of new requests traced."""

    collector: str
    sampling_percentage: float = DEFAULT_SAMPLING_PERCENTAGE


def validate(section: Mapping[str, Any] | None, prefix: str) -> str | None:
    """The problem with a Cluster's ``tracing`` section as ``"field: message"``,
    or None. ``collector`` is required; ``samplingPercentage`` is 0-100."""
    if section is None:
        return None
    collector = section.get("collector")
    if not isinstance(collector, str) or not collector:
        return f"{prefix}.collector: required, grpc://host:port or unix:///path"
    try:
        parse_service_uri(collector)
    except ValueError as exc:
        return f"{prefix}.collector: {exc}"
    ratio = section.get("samplingPercentage", DEFAULT_SAMPLING_PERCENTAGE)
    if (
        isinstance(ratio, bool)
        or not isinstance(ratio, int | float)
        or math.isnan(ratio)
        or not 0 <= ratio <= 100
    ):
        return f"{prefix}.samplingPercentage: must be a number from 0 to 100"
    return None


def settings_of(section: StoredTracing | None) -> TracingSettings | None:
    """The :class:`TracingSettings` of a stored Cluster's ``tracing``, or None (no tracing)."""
    if not section:
        return None
    return TracingSettings(
        collector=section["collector"],
        sampling_percentage=float(section.get("samplingPercentage", DEFAULT_SAMPLING_PERCENTAGE)),
    )


def hcm_tracing(settings: TracingSettings, service_name: str) -> JsonDict:
    """The HTTP connection manager's ``tracing`` (protojson) for an Envoy
    reporting as ``service_name`` (``gateway``, a sidecar's workload, ...)."""
    return {
        "randomSampling": {"value": settings.sampling_percentage},
        "spawnUpstreamSpan": True,
        "provider": {
            "name": TRACER_NAME,
            "typedConfig": {
                "@type": _OTEL_CONFIG,
                "grpcService": {
                    "envoyGrpc": {"clusterName": COLLECTOR_CLUSTER},
                    "timeout": "1s",
                },
                "serviceName": service_name,
            },
        },
    }


def collector_cluster(settings: TracingSettings) -> JsonDict:
    """The HTTP/2 cluster :func:`hcm_tracing` exports to."""
    return grpc_cluster(COLLECTOR_CLUSTER, settings.collector)


def document_section(settings: TracingSettings | None) -> JsonDict | None:
    """What the ``envoyconfig`` document (ClusterConfig's view) shows of tracing."""
    if settings is None:
        return None
    return {
        "collector": settings.collector,
        "samplingPercentage": settings.sampling_percentage,
        "tracer": TRACER_NAME,
        "cluster": COLLECTOR_CLUSTER,
    }
