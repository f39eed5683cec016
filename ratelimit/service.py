"""The decision: validate → match → store → statuses → response, with metrics.

Transport-free: the gRPC adapter calls :meth:`RateLimitService.decide` with
the request's bytes and sends the response's bytes back (a request seen
before is answered without parsing it, and the response is written in wire
format, not built as a message and serialized again), and it
maps the two exceptions (InvalidRequest → INVALID_ARGUMENT, StoreUnavailable
with ``failureMode: unavailable`` → UNAVAILABLE). The config is read through a
getter on every request, so a reload swaps the snapshot between requests and
never blocks one.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any, NamedTuple

from opentelemetry.trace import Span, SpanKind

from meshplane.rpc import incoming_trace_context
from meshplane.tracing import Tracing, parent_context
from ratelimit import dynamic_metadata, metrics
from ratelimit.config import RateLimit, RateLimitConfig
from ratelimit.decisions import DecisionRecorder
from ratelimit.plan import InvalidRequest, Plan, PlanBounds, plan_request
from ratelimit.response import can_deny, encode_response, failure_response
from ratelimit.settings import FailureMode, Settings
from ratelimit.store import CounterStore, Outcome, StoreUnavailable

log = logging.getLogger(__name__)

_MAX_LOGGED_UNKNOWN_DOMAINS = 100


class RateLimitService:
    """Decides ShouldRateLimit requests against a config snapshot and a store."""

    def __init__(
        self,
        config: Callable[[], RateLimitConfig],
        store: CounterStore,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.time,
        decisions: DecisionRecorder | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self._config = config
        self._decisions = decisions
        self._tracing = tracing
        self._store = store
        self._settings = settings
        self._clock = clock
        self._headers = settings.header_names if settings.headers_enabled else None
        self._bounds = plan_bounds(settings)
        self._unknown_logged: set[str] = set()
        self._rule_metrics: dict[tuple[str, str], metrics.RuleCounters] = {}
        # detailed_metric series, by (domain, detailed key): at most
        # settings.detailed_max_series per worker (see _detailed).
        self._detailed_series: dict[tuple[str, str], metrics.RuleCounters] = {}
        self._dynamic_metadata = settings.dynamic_metadata
        # This service's rows of a plan, in the plan's memo (see _rows).
        self._rows_key = object()
        self.register_rules()

    def register_rules(self) -> None:
        """Create the per-rule counters of every rule of the config in force, at 0.

        Called at start and after every config swap, so a rule's series exist
        before its first hit (``rate()`` then counts that hit). Rules that
        went away keep their series until the process restarts, as before.
        """
        for labels in self._config().rules():
            if labels not in self._rule_metrics:
                self._rule_metrics[labels] = metrics.RuleCounters.of(*labels)

    @property
    def traced(self) -> bool:
        return self._tracing is not None

    @property
    def store(self) -> CounterStore:
        return self._store

    def swap_store(self, store: CounterStore, failure_mode: FailureMode) -> CounterStore:
        """Make ``store`` (and ``failure_mode``) live for the next request; return
        the old store, which the caller closes once in-flight requests are done.
        Both assignments happen between two awaits, so no request sees a mix."""
        old, self._store = self._store, store
        self.set_failure_mode(failure_mode)
        return old

    def set_failure_mode(self, failure_mode: FailureMode) -> None:
        self._settings = replace(self._settings, failure_mode=failure_mode)

    def decide(self, raw_request: bytes) -> Coroutine[Any, Any, bytes]:
        """Answer one serialized RateLimitRequest with a serialized
        RateLimitResponse (await it). Raises InvalidRequest or StoreUnavailable.

        Not a coroutine itself but the one that decides, so that a call costs
        no coroutine frame of its own (each is created, resumed on the store's
        reply and finished on every call)."""
        tracing = self._tracing
        if tracing is not None:
            # The gate first: a sampled-out call takes the untraced path
            # (no span object, and no extra coroutine frame).
            traceparent, tracestate = incoming_trace_context()
            if tracing.gate(traceparent):
                return self._traced(tracing, raw_request, traceparent, tracestate)
        return self._decide(raw_request, None)

    async def _traced(
        self, tracing: Tracing, raw_request: bytes, traceparent: str | None, tracestate: str | None
    ) -> bytes:
        """:meth:`decide` in a span continuing the caller's W3C context
        (the ``traceparent`` gRPC metadata Envoy's tracer sends), with a
        child span for the store's round trip."""
        parent = parent_context(traceparent, tracestate)
        with tracing.tracer.start_as_current_span(
            "ratelimit ShouldRateLimit", context=parent, kind=SpanKind.SERVER
        ) as span:
            return await self._decide(raw_request, span)

    async def _decide(self, raw_request: bytes, span: Span | None) -> bytes:
        """The decision; ``span`` (tracing on) gets its attributes and a store child."""
        # One coroutine for the whole decision (no nested awaits but the
        # store's): every extra frame costs on each of thousands of calls a second.
        started = time.perf_counter()
        try:
            now = self._clock()
            try:
                plan = plan_request(
                    self._config(),
                    raw_request,
                    now,
                    key_prefix=self._settings.key_prefix,
                    bounds=self._bounds,
                    quota_mode=self._settings.quota_mode,
                )
            except InvalidRequest:
                metrics.DECISIONS.labels("invalid").inc()
                raise
            if not plan.domain_known:
                self._unknown_domain(plan.domain)
                if span is not None:
                    span.set_attributes({"meshplane.domain": plan.domain, **_UNKNOWN})
                response = encode_response(plan, None, now, headers=self._headers)
                if self._dynamic_metadata:
                    response += dynamic_metadata.encode_field(plan, None, raw_request)
                return response
            outcome: Outcome | None = None
            if plan.buckets:
                try:
                    if span is None:
                        outcome = await self._store.apply(plan.buckets, now)
                    else:
                        outcome = await self._traced_apply(plan, now)
                except StoreUnavailable as exc:
                    return self._store_failed(plan, exc, now)
                self._count(plan, outcome)
            response = encode_response(plan, outcome, now, headers=self._headers)
            if self._dynamic_metadata:
                response += dynamic_metadata.encode_field(plan, outcome, raw_request)
            if self._decisions is not None and outcome is not None and not all(outcome.fits):
                response += self._logged(plan, outcome, raw_request)
            over = outcome is not None and not outcome.allowed
            if span is not None:
                _annotate(span, plan, over)
            metrics.add(metrics.DECIDED_OVER if over else metrics.DECIDED_OK)
            return response
        finally:
            metrics.observe_latency(time.perf_counter() - started)
            metrics.schedule_flush()

    def _logged(self, plan: Plan, outcome: Outcome, raw_request: bytes) -> bytes:
        """The decision line of a hit, and the ``x-decision-id`` entry on a 429.
        Never raises: a logging failure must not turn a decision into an error."""
        assert self._decisions is not None
        try:
            return self._decisions.record(plan, outcome, raw_request)
        except Exception as exc:
            log.error("writing a decision line failed", extra={"error": type(exc).__name__})
            return b""

    async def _traced_apply(self, plan: Plan, now: float) -> Outcome:
        """The store's round trip as a child span of the current one."""
        assert self._tracing is not None
        with self._tracing.tracer.start_as_current_span(
            f"ratelimit store {self._store.kind}", kind=SpanKind.CLIENT
        ) as child:
            child.set_attribute("meshplane.buckets", len(plan.buckets))
            return await self._store.apply(plan.buckets, now)

    async def close(self) -> None:
        """Flush the aggregated metrics and release the store (and the decision log)."""
        if self._decisions is not None:
            self._decisions.close()
        metrics.flush()
        await self._store.close()
        metrics.flush()

    def _unknown_domain(self, domain: str) -> None:
        metrics.DECISIONS.labels("unknown_domain").inc()
        metrics.UNKNOWN_DOMAIN.inc()
        # Log each unknown domain once (bounded), not once per request.
        if domain not in self._unknown_logged and (
            len(self._unknown_logged) < _MAX_LOGGED_UNKNOWN_DOMAINS
        ):
            self._unknown_logged.add(domain)
            log.warning("request for a domain that is not configured", extra={"domain": domain})

    def _store_failed(self, plan: Plan, exc: StoreUnavailable, now: float) -> bytes:
        """Answer by ``failureMode``. A request whose only limits are shadow
        rules cannot be denied by them, so it is answered OK in every mode
        (an UNAVAILABLE could make Envoy's failure_mode_deny deny it)."""
        metrics.STORE_ERRORS.labels(exc.reason).inc()
        mode = self._settings.failure_mode
        binding = can_deny(plan)
        if mode == "unavailable" and binding:
            metrics.DECISIONS.labels("store_unavailable").inc()
            raise exc
        deny = mode == "deny" and binding
        metrics.DECISIONS.labels("failure_deny" if deny else "failure_allow").inc()
        response = failure_response(plan, now, deny=deny, headers=self._headers)
        return bytes(response.SerializeToString())

    def _count(self, plan: Plan, outcome: Outcome) -> None:
        """Add the decision's hits to the per-rule counters (the aggregate).

        As envoyproxy/ratelimit counts them: a row's cost counts in total_hits;
        in over_limit too when its bucket could not cover it (and in
        shadow_mode when a shadow rule let it through); else, if the request
        was allowed, every consumed hit is within_limit, and near_limit is the
        subset above the threshold. A cost-0 row counts nothing. Written with
        plain comparisons: the builtins ``max``/``min`` cost several of them each."""
        pending = metrics.pending
        allowed = outcome.allowed
        fits = outcome.fits
        for counters, cost, index, shadow, bucket_cost, threshold in self._rows(plan):
            if not cost:
                continue
            child = counters.total_hits
            pending[child] = pending.get(child, 0) + cost
            if not fits[index]:
                child = counters.over_limit
                pending[child] = pending.get(child, 0) + cost
                if shadow and allowed:
                    child = counters.shadow_mode
                    pending[child] = pending.get(child, 0) + cost
                continue
            if not allowed:
                continue  # another bucket denied: nothing was consumed here
            child = counters.within_limit
            pending[child] = pending.get(child, 0) + cost
            after = outcome.counts[index]
            if after > threshold:  # the hits between the threshold and ``after``, at most ``cost``
                start = after - bucket_cost
                near = after - (start if start > threshold else threshold)
                child = counters.near_limit
                pending[child] = pending.get(child, 0) + (near if near < cost else cost)

    def _rule_counters(self, domain: str, rule: str) -> metrics.RuleCounters:
        """The counters of a rule label from the config (bounded by the config)."""
        labels = (domain, rule)
        counters = self._rule_metrics.get(labels)
        if counters is None:
            counters = self._rule_metrics[labels] = metrics.RuleCounters.of(*labels)
        return counters

    def _detailed(self, limit: RateLimit, detail: str) -> metrics.RuleCounters:
        """The counters of a ``detailed_metric`` or ``value_to_metric`` series,
        whose label holds request values.

        Series are never removed (a multiprocess counter cannot be), so they
        are bounded: the first ``detailed_max_series`` keys of at most
        ``detailed_max_label_bytes`` bytes get their own; every other hit is
        counted under ``<rule>:overflow``, a label no request value can
        produce (a detailed key is ``<key>_<value>`` at every level)."""
        labels = (limit.domain, detail)
        counters = self._detailed_series.get(labels)
        if counters is not None:
            return counters
        settings = self._settings
        if (
            len(self._detailed_series) < settings.detailed_max_series
            and len(detail.encode()) <= settings.detailed_max_label_bytes
        ):
            counters = self._detailed_series[labels] = metrics.RuleCounters.of(*labels)
            return counters
        return self._rule_counters(limit.domain, limit.rule_id + metrics.OVERFLOW_SUFFIX)

    def _rows(self, plan: Plan) -> tuple[_Row, ...]:
        """What :meth:`_count` needs of each limited descriptor of a plan,
        worked out once per plan (a cached plan answers its whole window):
        the rule's counters, the cost, the bucket, and the near-limit threshold.
        They are kept in the plan's memo, so they live as long as the plan."""
        cached: tuple[_Row, ...] | None = plan.memo.get(self._rows_key)
        if cached is not None:
            return cached
        rows: list[_Row] = []
        for desc in plan.descriptors:
            limit = desc.limit
            if limit is None or desc.bucket is None:
                continue
            if desc.detail is None:
                counters = self._rule_counters(limit.domain, limit.rule_id)
            else:
                counters = self._detailed(limit, desc.detail)
            bucket = plan.buckets[desc.bucket]
            threshold = math.floor(bucket.limit * self._settings.near_limit_ratio)
            rows.append(
                _Row(counters, desc.cost, desc.bucket, limit.shadow_mode, bucket.cost, threshold)
            )
        result = plan.memo[self._rows_key] = tuple(rows)
        return result


_UNKNOWN = {"meshplane.decision": "allow", "meshplane.reason": "unknown_domain"}


def _annotate(span: Span, plan: Plan, over: bool) -> None:
    """Decision, reason and the rules that applied: never a descriptor value
    (values may be user ids or API keys)."""
    rules = sorted({d.limit.rule_id for d in plan.descriptors if d.limit is not None})
    span.set_attributes(
        {
            "meshplane.decision": "deny" if over else "allow",
            "meshplane.reason": "over_limit" if over else "within_limit",
            "meshplane.domain": plan.domain,
            "meshplane.policy": rules,
        }
    )


def plan_bounds(settings: Settings) -> PlanBounds:
    """The request caps and plan-cache budget of ``settings``."""
    return PlanBounds(
        max_descriptors=settings.max_descriptors,
        max_entries=settings.max_entries,
        max_value_bytes=settings.max_value_bytes,
        cache_bytes=settings.plan_cache_bytes,
        cache_entry_bytes=settings.plan_cache_entry_bytes,
    )


class _Row(NamedTuple):
    """One limited descriptor of a plan, as :meth:`RateLimitService._count` sees it."""

    counters: metrics.RuleCounters
    cost: int
    bucket: int
    shadow: bool
    bucket_cost: int  # the merged bucket's cost (several descriptors may share it)
    threshold: int  # near-limit threshold of the bucket's limit
