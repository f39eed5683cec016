"""Wiring of one worker: config source + store + service + gRPC + readiness.

Startup never waits for Redis: the client connects lazily, the worker starts
NOT_SERVING and a background probe flips readiness to SERVING once Redis
answers a PING (and back while it does not). So a pod without Redis stays
up and unready instead of crash-looping, and Kubernetes routes traffic only
to instances that can count.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from meshplane.config_source import FileSource
from meshplane.server import ASGIApp, WorkerContext
from ratelimit import metrics
from ratelimit.breaker import CircuitBreaker
from ratelimit.config import RateLimitConfig, load_config
from ratelimit.grpc_api import SERVICE_NAME, add_to_server
from ratelimit.redis_url import parse_redis_url, redact
from ratelimit.service import RateLimitService
from ratelimit.settings import Settings
from ratelimit.store import CounterStore, StoreUnavailable
from ratelimit.store.local_cache import LocalCacheStore
from ratelimit.store.memory import MemoryStore
from ratelimit.store.redis import RedisStore
from ratelimit.store.resp import build_keyed_client

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AppOptions:
    """Everything a worker needs; picklable, so it crosses the spawn boundary."""

    config_path: str
    redis_url: str | None = field(default=None, repr=False)
    settings: Settings = field(default_factory=Settings)
    reload_interval: float = 1.0
    probe_interval: float = 0.5


def build_store(options: AppOptions) -> tuple[CounterStore, RedisStore | None]:
    """The store stack for the options: (outermost store, the Redis store if any)."""
    settings = options.settings
    redis_store: RedisStore | None = None
    inner: CounterStore
    if options.redis_url:
        target = parse_redis_url(options.redis_url)
        client = build_keyed_client(
            target,
            on_flush=metrics.REDIS_ROUND_TRIPS.inc,
            pipeline_window=settings.redis_pipeline_window,
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


class RateLimitApp:
    """The GrpcApp of the rate-limit service."""

    service_names: Sequence[str] = (SERVICE_NAME,)
    http_app: ASGIApp | None = None

    def __init__(self, options: AppOptions, *, clock: Callable[[], float] = time.time) -> None:
        self.options = options
        self._clock = clock
        self.source: FileSource[RateLimitConfig] = FileSource(
            options.config_path,
            load_config,
            name="ratelimit",
            interval=options.reload_interval,
        )
        self._tasks: list[asyncio.Task[None]] = []
        self.service: RateLimitService | None = None
        self._redis: RedisStore | None = None

    async def start(self, ctx: WorkerContext) -> None:
        self.source.load_initial()
        store, self._redis = build_store(self.options)
        self.service = RateLimitService(
            lambda: self.source.current, store, self.options.settings, clock=self._clock
        )
        add_to_server(self.service, ctx.server)
        self._tasks.append(asyncio.create_task(self.source.watch()))
        if self._redis is not None:
            assert self.options.redis_url is not None
            log.info("counting in Redis", extra={"redis": redact(self.options.redis_url)})
            ctx.set_serving(False)
            self._tasks.append(asyncio.create_task(self._probe(ctx, self._redis)))
        else:
            log.warning(
                "no Redis URL: counting in this process's memory; limits are per instance, "
                "not global across instances"
            )

    async def _probe(self, ctx: WorkerContext, store: RedisStore) -> None:
        """Readiness follows Redis; a good PING also closes an open breaker."""
        serving: bool | None = None
        while True:
            try:
                await store.ping()
                ok = True
            except StoreUnavailable as exc:
                ok = False
                detail = str(exc)
            if ok:
                store.breaker.record_success()
            if ok != serving:
                serving = ok
                ctx.set_serving(ok)
                if ok:
                    log.info("Redis reachable; serving")
                else:
                    log.warning("Redis unreachable; not ready", extra={"error": detail})
            await asyncio.sleep(self.options.probe_interval)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self.service is not None:
            await self.service.close()  # flushes the aggregated metrics too


def build_app(options: AppOptions) -> RateLimitApp:
    """Module-level factory, so ``functools.partial(build_app, options)`` pickles."""
    return RateLimitApp(options)
