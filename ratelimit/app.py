"""Wiring of one worker: config source + store + service + gRPC + readiness.

Startup never waits for Redis: the client connects lazily and a background
probe PINGs it, so a pod without Redis stays up instead of crash-looping.
Readiness follows that probe only in failureMode ``unavailable``: such a
worker starts NOT_SERVING and turns SERVING once Redis answers, so
Kubernetes routes traffic only to instances that can count. With ``allow``
or ``deny`` a worker answers every request by the operator's policy, so it
is SERVING from the start and stays so; Redis being down shows in
``meshplane_ratelimit_redis_unreachable`` and the log instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from meshplane.config_source import FileSource, resolve_once
from meshplane.decision_log import DecisionLog, DecisionLogSettings
from meshplane.server_contract import ASGIApp, WorkerContext
from meshplane.tracing import TraceSettings, Tracing, start_tracing
from ratelimit import metrics
from ratelimit.breaker import CircuitBreaker
from ratelimit.config import RateLimitConfig, load_config
from ratelimit.decisions import DecisionRecorder
from ratelimit.grpc_api import SERVICE_NAME, register
from ratelimit.quota import grpc_api as quota_api
from ratelimit.quota.service import QuotaService, QuotaSettings
from ratelimit.quota.usage import RedisUsage, UsageStore
from ratelimit.redis_url import parse_redis_url, redact
from ratelimit.service import RateLimitService
from ratelimit.settings import FailureMode, Settings
from ratelimit.store import CounterStore, StoreUnavailable
from ratelimit.store.local_cache import LocalCacheStore
from ratelimit.store.memory import MemoryStore
from ratelimit.store.redis import RedisStore
from ratelimit.store.resp import Pipelining, build_keyed_client
from ratelimit.store.switches import StoreSwitches, load_switches

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AppOptions:
    """Everything a worker needs; picklable, so it crosses the spawn boundary."""

    config_path: str
    redis_url: str | None = field(default=None, repr=False)
    settings: Settings = field(default_factory=Settings)
    reload_interval: float = 1.0
    probe_interval: float = 0.5
    decision_log: DecisionLogSettings | None = None
    tracing: TraceSettings | None = None


@dataclass(frozen=True)
class RateLimitSnapshot:
    """One loaded config directory: the limits, and the cluster's switches if it has any."""

    config: RateLimitConfig
    switches: StoreSwitches | None = None


def load_snapshot(path: Path) -> RateLimitSnapshot:
    """The loader of both modes; it also validates what ``--control-plane`` delivers,
    so a switch that cannot be applied is NACKed before it goes live.

    Limits and switches come from one snapshot: ``path`` (``cache/current``
    under ``--control-plane``, swapped by the subscriber) is resolved once,
    so a swap between the two reads cannot pair one snapshot's limits with
    another's switches."""
    resolved = resolve_once(path)
    return RateLimitSnapshot(load_config(resolved), load_switches(resolved))


@dataclass(frozen=True)
class StoreChoice:
    """The counter store and failure mode in force, and why."""

    redis_url: str | None = field(repr=False)
    failure_mode: FailureMode
    source: str


def choose_store(options: AppOptions, switches: StoreSwitches | None) -> StoreChoice:
    """Local ``--redis-url``/``REDIS_URL`` wins over the cluster's store switch
    (the operator pinned this instance to a Redis); the cluster's failureMode,
    when set, wins over the local settings (it is policy, like the limits)."""
    mode = options.settings.failure_mode
    if switches is not None and switches.failure_mode is not None:
        mode = switches.failure_mode
    if options.redis_url:
        return StoreChoice(options.redis_url, mode, "--redis-url / REDIS_URL")
    if switches is not None and switches.store_set:
        return StoreChoice(switches.redis_url, mode, f"cluster switch {switches.store_source}")
    return StoreChoice(None, mode, "default (no Redis URL)")


def build_store(
    settings: Settings, redis_url: str | None
) -> tuple[CounterStore, RedisStore | None]:
    """The store stack: (outermost store, the Redis store if any); no URL: in memory."""
    redis_store: RedisStore | None = None
    inner: CounterStore
    if redis_url:
        target = parse_redis_url(redis_url)
        client = build_keyed_client(
            target,
            on_flush=metrics.REDIS_ROUND_TRIPS.inc,
            pipelining=Pipelining(settings.redis_pipeline_window, settings.redis_pipeline_limit),
        )
        redis_store = RedisStore(
            client,
            timeout=settings.store_timeout,
            breaker=CircuitBreaker(
                failure_threshold=settings.breaker_failures,
                open_seconds=settings.breaker_open_seconds,
                min_streak_seconds=settings.breaker_min_streak_seconds,
            ),
            on_decision=metrics.REDIS_DECISIONS.inc,
            # Packed calls are derived from cached plans: half their budget.
            command_cache_bytes=settings.plan_cache_bytes // 2,
        )
        inner = redis_store
    else:
        inner = MemoryStore()
    if settings.local_cache_size > 0 and redis_store is not None:
        # In memory the counters are already local: a cache would only add work.
        return (
            LocalCacheStore(
                inner, max_entries=settings.local_cache_size, on_hit=metrics.LOCAL_CACHE_HITS.inc
            ),
            redis_store,
        )
    return inner, redis_store


def build_usage(settings: Settings, redis_url: str | None) -> UsageStore | None:
    """Where the quota service keeps every gateway's demand: the counters' Redis
    (its own connection), or None: this process's memory."""
    if not redis_url:
        return None
    client = build_keyed_client(parse_redis_url(redis_url))
    # Reports come every few seconds: a longer wait than a decision's is harmless.
    return RedisUsage(client, timeout=max(settings.store_timeout, 0.5))


class RateLimitApp:
    """The GrpcApp of the rate-limit service: ShouldRateLimit (exact limits,
    one call a request) and StreamRateLimitQuotas (quotas Envoy enforces)."""

    service_names: Sequence[str] = (SERVICE_NAME, quota_api.SERVICE_NAME)
    http_app: ASGIApp | None = None

    def __init__(self, options: AppOptions, *, clock: Callable[[], float] = time.time) -> None:
        self.options = options
        self._clock = clock
        self.source: FileSource[RateLimitSnapshot] = FileSource(
            options.config_path,
            load_snapshot,
            name="ratelimit",
            interval=options.reload_interval,
        )
        self._tasks: list[asyncio.Task[None]] = []
        self.service: RateLimitService | None = None
        self._redis: RedisStore | None = None
        self._probe_task: asyncio.Task[None] | None = None
        self._ctx: WorkerContext | None = None
        self.choice: StoreChoice | None = None
        self.tracing: Tracing | None = None
        self.quota: QuotaService | None = None

    async def start(self, ctx: WorkerContext) -> None:
        self._ctx = ctx
        snapshot = self.source.load_initial()
        self.choice = choose_store(self.options, snapshot.switches)
        store, self._redis = build_store(self.options.settings, self.choice.redis_url)
        settings = replace(self.options.settings, failure_mode=self.choice.failure_mode)
        decisions = self.options.decision_log
        self.tracing = start_tracing(self.options.tracing)
        self.service = RateLimitService(
            lambda: self.source.current.config,
            store,
            settings,
            clock=self._clock,
            decisions=(
                DecisionRecorder(DecisionLog("ratelimit", decisions))
                if decisions is not None and decisions.enabled
                else None
            ),
            tracing=self.tracing,
        )
        register(self.service, ctx)
        self.quota = QuotaService(
            lambda: self.source.current.config,
            build_usage(self.options.settings, self.choice.redis_url),
            settings=QuotaSettings(
                assignment_ttl=self.options.settings.quota_assignment_ttl,
                stale_after=self.options.settings.quota_stale_after,
            ),
            clock=self._clock,
        )
        quota_api.register(self.quota, ctx)
        self._tasks.append(asyncio.create_task(self._drain_quotas(ctx)))
        self.source.add_listener(self._on_snapshot)
        self._tasks.append(asyncio.create_task(self.source.watch()))
        self._announce(self.choice, snapshot.switches)
        self._follow_redis()

    async def _drain_quotas(self, ctx: WorkerContext) -> None:
        """When the worker starts draining (its health state closes), every quota
        stream is told to fall back (TTL 0) and ended, so the drain does not wait
        on streams that never end by themselves."""
        async for _ in ctx.health.watch(""):
            pass
        if self.quota is not None:
            await self.quota.drain()

    def _announce(self, choice: StoreChoice, switches: StoreSwitches | None) -> None:
        extra = {"source": choice.source, "failure_mode": choice.failure_mode}
        if choice.redis_url:
            log.info("counting in Redis", extra={**extra, "redis": redact(choice.redis_url)})
        else:
            log.warning(
                "no Redis URL: counting in this process's memory; limits are per instance, "
                "not global across instances",
                extra=extra,
            )
        if self.options.redis_url and switches is not None and switches.store_set:
            log.warning(
                "the cluster's counter-store switch is ignored: this instance was given "
                "--redis-url / REDIS_URL, which wins",
                extra={"switch": switches.store_source},
            )

    def _follow_redis(self) -> None:
        """Probe the Redis store in force (if any); readiness follows it only in
        failureMode ``unavailable`` (see :meth:`_probe`)."""
        assert self._ctx is not None
        if self._probe_task is not None:
            self._probe_task.cancel()
            self._probe_task = None
        if self._redis is not None:
            # allow/deny answer every request by policy: ready before Redis is.
            by_policy = self.choice is not None and self.choice.failure_mode != "unavailable"
            self._ctx.set_serving(by_policy)
            self._probe_task = asyncio.create_task(self._probe(self._ctx, self._redis))
        else:
            self._ctx.set_serving(True)

    def _on_snapshot(self, snapshot: RateLimitSnapshot) -> None:
        """Called on the loop after every swap: new rules' counters at 0, and a changed
        store switch applied."""
        if self.service is not None:
            self.service.register_rules()
        choice = choose_store(self.options, snapshot.switches)
        if choice == self.choice:
            return
        self._tasks.append(asyncio.create_task(self._swap_store(choice, snapshot.switches)))

    async def _swap_store(self, choice: StoreChoice, switches: StoreSwitches | None) -> None:
        """New store first, then one swap between requests, then close the old one."""
        assert self.service is not None
        previous = self.choice
        if previous is not None and previous.redis_url == choice.redis_url:
            self.service.set_failure_mode(choice.failure_mode)  # same store: just the mode
            self.choice = choice
            log.info("failure mode changed", extra={"failure_mode": choice.failure_mode})
            return
        store, redis = build_store(self.options.settings, choice.redis_url)
        old = self.service.swap_store(store, choice.failure_mode)
        if self.quota is not None:
            old_usage = self.quota.swap_usage(build_usage(self.options.settings, choice.redis_url))
            if old_usage is not None:
                await old_usage.close()
        self._redis, self.choice = redis, choice
        self._follow_redis()
        self._announce(choice, switches)
        # Requests already waiting on the old store finish within its timeout.
        await asyncio.sleep(self.options.settings.store_timeout + 0.1)
        await old.close()

    async def _probe(self, ctx: WorkerContext, store: RedisStore) -> None:
        """PING Redis; a good PING also closes an open breaker.

        Readiness follows Redis only in failureMode ``unavailable``, where a
        worker without Redis can only answer UNAVAILABLE. With ``allow`` or
        ``deny`` it answers every request by the operator's policy, so it
        stays SERVING: dropping it from the endpoints would hand the decision
        to Envoy's ``failure_mode_deny`` instead. Redis being down is then
        told by the log below and ``meshplane_ratelimit_redis_unreachable``
        (set by the PING). The mode is read on every round, since a cluster
        switch can change it without changing the store.
        """
        reachable: bool | None = None
        serving: bool | None = None
        while True:
            try:
                await store.ping()
                ok, detail = True, ""
            except StoreUnavailable as exc:
                ok, detail = False, str(exc)
            if ok:
                store.breaker.record_success()
            mode = self.choice.failure_mode if self.choice is not None else "unavailable"
            by_policy = mode != "unavailable"
            if ok != reachable:
                reachable = ok
                if ok:
                    log.info("Redis reachable")
                else:
                    log.warning(
                        "Redis unreachable; "
                        + ("answering by failureMode" if by_policy else "not ready"),
                        extra={"error": detail, "failure_mode": mode},
                    )
            ready = ok or by_policy
            if ready != serving:
                serving = ready
                ctx.set_serving(ready)
            await asyncio.sleep(self.options.probe_interval)

    async def stop(self) -> None:
        if self._probe_task is not None:
            self._tasks.append(self._probe_task)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self.quota is not None:
            await self.quota.stop()
        if self.service is not None:
            await self.service.close()  # flushes the aggregated metrics too
        if self.tracing is not None:  # export what is queued before the worker exits
            await asyncio.to_thread(self.tracing.shutdown)


def build_app(options: AppOptions) -> RateLimitApp:
    """Module-level factory, so ``functools.partial(build_app, options)`` pickles."""
    return RateLimitApp(options)
