"""Traces: the one owner of tracing settings, the OTLP exporters and the tracer.

Tracing is OFF unless an OTLP endpoint is given (``--otlp-endpoint`` or
``OTEL_EXPORTER_OTLP_ENDPOINT``), and a sampling ratio of 0 (or
``always_off``) is off too. Off means :func:`start_tracing` returns ``None``:
no provider, no processor thread, and the services' hot paths test one
attribute for ``None`` and create no span object at all. That is why "off"
is not an always-off sampler: a sampler still makes a (non-recording) span
per call.

On, the sampling decision is :class:`Gate`'s, taken before the SDK is asked
for anything (the incoming ``traceparent``'s flag, or a cheap draw), so a
sampled-out call costs a header lookup and a comparison, like off; only a
sampled call builds an SDK span (whose sampler is then ALWAYS_ON).

The exporters are our own (a few lines each) instead of the
``opentelemetry-exporter-otlp-*`` packages, which pull
``googleapis-common-protos`` and shadow xds-protos' ``google/rpc``. Both
encode with ``opentelemetry-exporter-otlp-proto-common`` and run behind the
SDK's ``BatchSpanProcessor``, so a request never waits on the collector.

Settings come from the standard environment variables, then the service's
own flags override them (an operator's explicit flag wins over an ambient
variable). Every value is validated, and a bad one is a :class:`ConfigError`
naming the variable or flag, never a silent fallback.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

import grpc
import httpx
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider, sampling
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Span, SpanKind, Tracer, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from meshplane.config_error import ConfigError
from meshplane.traceparent import MAX_TRACEPARENT
from meshplane.traceparent import parse as parse_traceparent

log = logging.getLogger(__name__)

Protocol = Literal["grpc", "http/protobuf"]
PROTOCOLS: tuple[Protocol, ...] = ("grpc", "http/protobuf")
#: OTEL_TRACES_SAMPLER values we honour (the spec's built-in samplers).
SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
_RATIO_SAMPLERS = ("traceidratio", "parentbased_traceidratio")
_MAX_ENV_BYTES = 2048  # no setting needs more; a longer one is a mistake
#: W3C traceparent is 55 characters; tracestate at most 32 members of ~512.
_MAX_TRACESTATE = 8192
EXPORT_TIMEOUT_SECONDS = 10.0
_PROPAGATOR = TraceContextTextMapPropagator()
_TRACE_ID_RANGE = 1 << 64  # the SDK's TraceIdRatioBased compares the low 64 bits


@dataclass(frozen=True)
class TraceSettings:
    """Where and how much to trace; picklable, so workers get it from the supervisor."""

    endpoint: str | None = None
    protocol: Protocol = "grpc"
    sampler: str = "parentbased_always_on"
    ratio: float = 1.0
    service_name: str = "meshplane"

    @property
    def enabled(self) -> bool:
        """False when nothing could ever be exported (see the module docstring)."""
        if self.endpoint is None or self.sampler == "always_off":
            return False
        return not (self.sampler in _RATIO_SAMPLERS and self.ratio == 0.0)


def _env(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    if value is None or not value.strip():
        return None
    if len(value) > _MAX_ENV_BYTES:
        raise ConfigError(f"longer than {_MAX_ENV_BYTES} characters", field=name)
    return value.strip()


def _endpoint(value: str, field: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"must be an http:// or https:// URL with a host, got {value!r}", field=field
        )
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ConfigError(f"bad port in {value!r}", field=field) from None
    return value.rstrip("/")


def _ratio(value: str | float, field: str) -> float:
    try:
        ratio = float(value)
    except ValueError:
        raise ConfigError(f"must be a number from 0 to 1, got {value!r}", field=field) from None
    if math.isnan(ratio) or not 0.0 <= ratio <= 1.0:
        raise ConfigError(f"must be a number from 0 to 1, got {value!r}", field=field)
    return ratio


def settings_from(
    env: Mapping[str, str],
    *,
    service: str,
    endpoint: str | None = None,
    protocol: str | None = None,
    sampling: float | None = None,
) -> TraceSettings:
    """Settings from the OTEL_* variables in ``env``, overridden by the flags given.

    ``sampling`` (``--trace-sampling``) means ``parentbased_traceidratio`` with
    that ratio: Envoy's decision is followed, a new trace is sampled at the ratio.
    """
    url = endpoint or _env(env, "OTEL_EXPORTER_OTLP_ENDPOINT")
    field = "--otlp-endpoint" if endpoint else "OTEL_EXPORTER_OTLP_ENDPOINT"
    proto = protocol or _env(env, "OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc"
    if proto not in PROTOCOLS:
        pfield = "--otlp-protocol" if protocol else "OTEL_EXPORTER_OTLP_PROTOCOL"
        raise ConfigError(f"must be one of {', '.join(PROTOCOLS)}, got {proto!r}", field=pfield)
    sampler = (_env(env, "OTEL_TRACES_SAMPLER") or "parentbased_always_on").lower()
    if sampler not in SAMPLERS:
        raise ConfigError(
            f"must be one of {', '.join(SAMPLERS)}, got {sampler!r}", field="OTEL_TRACES_SAMPLER"
        )
    ratio = 1.0
    arg = _env(env, "OTEL_TRACES_SAMPLER_ARG")
    if arg is not None and sampler in _RATIO_SAMPLERS:
        ratio = _ratio(arg, "OTEL_TRACES_SAMPLER_ARG")
    if sampling is not None:
        sampler, ratio = "parentbased_traceidratio", _ratio(sampling, "--trace-sampling")
    name = _env(env, "OTEL_SERVICE_NAME") or service
    return TraceSettings(
        endpoint=None if url is None else _endpoint(url, field),
        protocol=proto,
        sampler=sampler,
        ratio=ratio,
        service_name=name,
    )


class Gate:
    """The sampling decision, taken before the SDK is asked for anything.

    Called with the incoming ``traceparent`` (or None) on every call of a
    traced service; an unsampled call then costs this lookup and a
    comparison, and makes no span object and no context. It is the one
    reader of ``OTEL_TRACES_SAMPLER`` semantics (via :class:`TraceSettings`):

    - ``parentbased_*``: a valid parent's sampled flag decides; without one,
      ``always_on`` samples, ``always_off`` does not, ``traceidratio`` draws;
    - ``traceidratio``: with a valid parent, its trace id decides (the SDK's
      rule: the low 64 bits below ``ratio * 2**64``, so every service of a
      trace agrees); without one, a draw;
    - ``always_on``: every call; ``always_off``: none.

    The draw is ``random.random()`` (one C call), not a trace id: the SDK
    makes the id only for a call that is sampled. The SDK's own sampler is
    then ALWAYS_ON, since the gate already decided. Pure: ``draw`` is passed
    in, so the table test fixes it.
    """

    __slots__ = ("_bound", "_draw", "_follow_parent", "_ratio", "_root")

    def __init__(
        self, sampler: str, ratio: float, draw: Callable[[], float] = random.random
    ) -> None:
        if sampler not in SAMPLERS:
            raise ValueError(f"unknown sampler {sampler!r}")
        self._follow_parent = sampler.startswith("parentbased_")
        base = sampler.removeprefix("parentbased_")
        self._ratio = {"always_on": 1.0, "always_off": 0.0}.get(base, ratio)
        self._bound = round(self._ratio * _TRACE_ID_RANGE)
        self._draw = draw
        #: what a call without a (valid) parent gets: a constant, or None = draw.
        self._root: bool | None = None if 0.0 < self._ratio < 1.0 else self._ratio == 1.0

    def __call__(self, traceparent: str | None) -> bool:
        """Whether the call with this ``traceparent`` header is sampled."""
        if traceparent is not None:
            parent = parse_traceparent(traceparent)
            if parent is not None:
                if self._follow_parent:
                    return parent.sampled
                return int(parent.trace_id[16:], 16) < self._bound
        if self._root is None:
            return self._draw() < self._ratio
        return self._root


class GrpcSpanExporter(SpanExporter):
    """OTLP/gRPC: ``TraceService/Export`` on ``host:port`` (TLS for https://)."""

    def __init__(self, endpoint: str, timeout: float = EXPORT_TIMEOUT_SECONDS) -> None:
        parts = urlsplit(endpoint)
        target = f"{parts.hostname}:{parts.port or 4317}"
        if parts.scheme == "https":
            self._channel = grpc.secure_channel(target, grpc.ssl_channel_credentials())
        else:
            self._channel = grpc.insecure_channel(target)
        self._stub = trace_service_pb2_grpc.TraceServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._timeout = timeout

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            self._stub.Export(encode_spans(spans), timeout=self._timeout)
        except grpc.RpcError as exc:
            log.warning("OTLP/gRPC span export failed", extra={"error": str(exc.code())})
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._channel.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class HttpSpanExporter(SpanExporter):
    """OTLP/HTTP: POST ``application/x-protobuf`` to ``<endpoint>/v1/traces``."""

    def __init__(self, endpoint: str, timeout: float = EXPORT_TIMEOUT_SECONDS) -> None:
        self._url = endpoint + "/v1/traces"
        self._client = httpx.Client(timeout=timeout)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        body = encode_spans(spans).SerializeToString()
        try:
            response = self._client.post(
                self._url, content=body, headers={"content-type": "application/x-protobuf"}
            )
        except httpx.HTTPError as exc:
            log.warning("OTLP/HTTP span export failed", extra={"error": type(exc).__name__})
            return SpanExportResult.FAILURE
        if response.status_code // 100 != 2:
            log.warning("OTLP/HTTP span export refused", extra={"status": response.status_code})
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._client.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


@dataclass(frozen=True)
class Tracing:
    """A running tracer and its :class:`Gate`; :meth:`shutdown` exports what
    is queued (SIGTERM drain). Ask ``gate(traceparent)`` first, and only on
    True start a span with ``tracer``."""

    tracer: Tracer
    provider: TracerProvider
    gate: Gate

    def shutdown(self) -> None:
        self.provider.shutdown()


def exporter_for(settings: TraceSettings) -> SpanExporter:
    """The OTLP exporter of ``settings.protocol``."""
    assert settings.endpoint is not None
    if settings.protocol == "grpc":
        return GrpcSpanExporter(settings.endpoint)
    return HttpSpanExporter(settings.endpoint)


def start_tracing(settings: TraceSettings | None) -> Tracing | None:
    """A tracer exporting per ``settings``, or None when tracing is off.

    Called in each worker process (the processor's thread does not survive a
    fork). The provider is private, not the global one, so one process could
    hold two and tests never leak one into another.
    """
    if settings is None or not settings.enabled:
        return None
    provider = TracerProvider(
        sampler=sampling.ALWAYS_ON,  # the Gate decided before the SDK is asked
        resource=Resource.create({"service.name": settings.service_name}),
    )
    provider.add_span_processor(BatchSpanProcessor(exporter_for(settings)))
    gate = Gate(settings.sampler, settings.ratio)
    return Tracing(provider.get_tracer("meshplane"), provider, gate)


def settings_from_args(
    args: argparse.Namespace, env: Mapping[str, str], service: str
) -> TraceSettings:
    """:func:`settings_from` with the flags of :func:`add_arguments`."""
    return settings_from(
        env,
        service=service,
        endpoint=args.otlp_endpoint,
        protocol=args.otlp_protocol,
        sampling=args.trace_sampling,
    )


def parent_context(traceparent: str | None, tracestate: str | None = None) -> Context | None:
    """The W3C trace context of an incoming call, or None (size-capped, never raises)."""
    if not traceparent or len(traceparent) > MAX_TRACEPARENT:
        return None
    carrier = {"traceparent": traceparent}
    if tracestate and len(tracestate) <= _MAX_TRACESTATE:
        carrier["tracestate"] = tracestate
    return _PROPAGATOR.extract(carrier)


def outgoing_trace_context() -> tuple[str, str]:
    """``(traceparent, tracestate)`` of the current span when it is sampled, for
    a call to another process to continue (empty strings otherwise)."""
    if not get_current_span().is_recording():
        return "", ""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent", ""), carrier.get("tracestate", "")


@contextlib.contextmanager
def child_span(
    tracer: Tracer | None,
    name: str,
    attributes: Mapping[str, AttributeValue] | None = None,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
) -> Iterator[Span | None]:
    """A span for one unit of work under the current *recording* span, else nothing.

    For work done on behalf of a traced call (mgmt-api's transactions and
    publishes, the agent's tunnel calls): the call's gate already decided,
    so work under a sampled call is traced and work under an unsampled (or
    untraced, or background) one makes no span object. Yields the span
    (to add attributes once the work is done) or None.
    """
    if tracer is None or not get_current_span().is_recording():
        yield None
        return
    with tracer.start_as_current_span(name, kind=kind, attributes=attributes) as span:
        yield span


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--otlp-endpoint``, ``--otlp-protocol`` and ``--trace-sampling``."""
    add = parser.add_argument
    add("--otlp-endpoint", help="export traces over OTLP to this URL (off when unset)")
    add("--otlp-protocol", choices=PROTOCOLS, help="grpc (default) or http/protobuf")
    add("--trace-sampling", type=float, help="ratio 0..1 of new traces to sample")
