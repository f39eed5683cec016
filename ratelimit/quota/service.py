"""The quota runner: gateways' usage reports in, token-bucket assignments out.

One :class:`QuotaStream` per gateway stream (Envoy opens one per RLQS server
and domain, and names the domain in its first message). For each bucket in a
report the runner

1. smooths the gateway's demand (allowed + denied per second, on the
   server's clock: Envoy's own ``time_elapsed`` is whole seconds);
2. writes it to the usage store and reads every gateway's
   (:mod:`ratelimit.quota.usage`: Redis, or memory);
3. splits the bucket's global limit by demand
   (:mod:`ratelimit.quota.allocation`), answers this gateway with its share,
   and pushes a new share to the other gateways on this instance whose
   assignment must change (gateways on other instances get theirs at their
   next report, at most one report interval later);
4. abandons a bucket a gateway has not used for ``abandon_after`` reports
   (``AbandonAction``: Envoy forgets it, and its next request subscribes it
   again), so neither side keeps buckets of traffic that stopped.

Every answer repeats the current assignment, so its TTL is refreshed at each
report; an unchanged token bucket is carried over by Envoy, not refilled. On
drain (SIGTERM) every stream gets its assignments again with a TTL of 0 and
is closed: Envoy switches to its configured fallback at once instead of
enforcing shares nobody will refresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from ratelimit import metrics
from ratelimit.config import RateLimitConfig
from ratelimit.quota import allocation
from ratelimit.quota.allocation import TokenBucket, Usage
from ratelimit.quota.buckets import bucket_limit, canonical
from ratelimit.quota.usage import MemoryUsage, UsageStore
from ratelimit.store import StoreUnavailable

log = logging.getLogger(__name__)

ActionKind = Literal["token_bucket", "allow_all", "deny_all", "abandon"]


@dataclass(frozen=True)
class QuotaSettings:
    """The protocol's timings. Envoy reports every 5 s whatever its config says
    (``reporting_interval`` is not read by the filter), so they are ours to
    set, not the gateway's. The TTL and the staleness are the operator's
    (``quota.assignmentTtlSeconds`` and ``quota.staleAfterSeconds`` in the
    service settings, docs/ratelimit.md)."""

    report_interval: float = allocation.REPORT_INTERVAL
    #: An assignment's TTL, whole seconds (Envoy reads only the seconds).
    assignment_ttl: int = allocation.DEFAULT_TTL
    #: A gateway not heard from for this long no longer takes a share.
    stale_after: float = allocation.DEFAULT_TTL
    #: Reports in a row without a request before a bucket is abandoned.
    abandon_after: int = 3
    #: Buckets one stream may subscribe, and the bytes of their ids (keys and
    #: values): caps on what a peer can make us hold (an id may be 17 entries of
    #: 512 bytes, so the count alone would let one stream hold 170 MB).
    max_buckets: int = 10_000
    max_bucket_bytes: int = 2 << 20
    #: The bytes of the bucket ids every stream of this worker holds together:
    #: the per-stream caps bound one peer, this bounds many. Past it a new
    #: bucket is refused like one past a stream's own cap; buckets already
    #: subscribed keep being served.
    max_worker_bucket_bytes: int = 32 << 20
    #: A stream silent this long is closed (pyvoy reports a peer that left only
    #: when something is sent to it).
    idle_timeout: float = 60.0


@dataclass(frozen=True, slots=True)
class BucketReport:
    """One bucket's usage in a report."""

    bucket_id: Mapping[str, str]
    allowed: int
    denied: int


@dataclass(frozen=True, slots=True)
class Action:
    """What to tell a gateway about one bucket."""

    bucket_id: Mapping[str, str]
    kind: ActionKind
    token_bucket: TokenBucket | None = None
    ttl: int = 0


@dataclass(slots=True)
class _Subscription:
    bucket_id: Mapping[str, str]
    demand: float | None = None
    last_at: float | None = None
    quiet: int = 0
    assigned: TokenBucket | None = None
    kind: ActionKind | None = None


@dataclass(eq=False)
class QuotaStream:
    """One gateway's stream: its domain, member id and subscribed buckets."""

    domain: str
    push: Callable[[Sequence[Action]], Awaitable[None]]
    member: str = field(default_factory=lambda: uuid.uuid4().hex)
    buckets: dict[str, _Subscription] = field(default_factory=dict)
    bucket_bytes: int = 0  # of the subscribed buckets' ids (QuotaSettings.max_bucket_bytes)
    ended: asyncio.Event = field(default_factory=asyncio.Event)


class TooManyBuckets(Exception):
    """A stream subscribed more buckets than ``max_buckets``."""


class QuotaService:
    """The runner shared by every stream of one worker (see the module doc)."""

    def __init__(
        self,
        config: Callable[[], RateLimitConfig],
        usage: UsageStore | None,
        *,
        settings: QuotaSettings = QuotaSettings(),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._usage = usage
        self._local = MemoryUsage()
        self.settings = settings
        self._clock = clock
        self._streams: set[QuotaStream] = set()
        self._subscribers: dict[str, set[QuotaStream]] = {}
        self._bucket_bytes = 0  # every stream's QuotaStream.bucket_bytes, summed
        self._store_down = False
        self.draining = False

    def swap_usage(self, usage: UsageStore | None) -> UsageStore | None:
        """A new usage store (the cluster switched Redis); the old one, to close."""
        old, self._usage = self._usage, usage
        return old

    @property
    def streams(self) -> int:
        return len(self._streams)

    def open(self, domain: str, push: Callable[[Sequence[Action]], Awaitable[None]]) -> QuotaStream:
        stream = QuotaStream(domain, push)
        self._streams.add(stream)
        log.info("quota stream opened", extra={"domain": domain, "member": stream.member})
        return stream

    @property
    def bucket_bytes(self) -> int:
        """What every stream's bucket ids hold (QuotaSettings.max_worker_bucket_bytes)."""
        return self._bucket_bytes

    async def close(self, stream: QuotaStream) -> None:
        """The stream ended: its buckets stop taking a share at once.

        Every bucket is dropped before the first wait, so a close cut short
        (cancelled at shutdown, a store that hangs) still gives their bytes back.
        """
        self._streams.discard(stream)
        keys = list(stream.buckets)
        for key in keys:
            self._drop(stream, key)
        for key in keys:
            await self._forget(stream, key)
        stream.ended.set()

    async def report(self, stream: QuotaStream, reports: Sequence[BucketReport]) -> list[Action]:
        """The answer to one report: an action per bucket in it."""
        metrics.QUOTA_REPORTS.inc()
        now = self._clock()
        actions: list[Action] = []
        for report in reports:
            action = await self._one(stream, report, now)
            if action is not None:
                actions.append(action)
        return actions

    async def _one(self, stream: QuotaStream, report: BucketReport, now: float) -> Action | None:
        key = canonical(report.bucket_id)
        sub = stream.buckets.get(key)
        if sub is None:
            sub = self._subscribe(stream, key, report.bucket_id)
        requests = report.allowed + report.denied
        if requests == 0 and sub.last_at is not None:
            sub.quiet += 1
            if sub.quiet >= self.settings.abandon_after:
                await self._unsubscribe(stream, key)
                metrics.QUOTA_ACTIONS.labels("abandon").inc()
                return Action(report.bucket_id, "abandon")
        else:
            sub.quiet = 0
        elapsed = 0.0 if sub.last_at is None else now - sub.last_at
        sub.demand = allocation.smoothed_demand(sub.demand, requests, elapsed)
        sub.last_at = now
        limit = bucket_limit(self._config(), report.bucket_id, stream.domain)
        if limit.rate is None or limit.rate <= 0:
            sub.kind = "allow_all" if limit.rate is None else "deny_all"
            sub.assigned = None
            metrics.QUOTA_ACTIONS.labels(sub.kind).inc()
            return Action(report.bucket_id, sub.kind, ttl=self.settings.assignment_ttl)
        view = await self._record(key, stream.member, Usage(sub.demand, now))
        shares = allocation.shares(
            limit.rate, allocation.active(view, now, self.settings.stale_after)
        )
        wanted = allocation.token_bucket(shares.get(stream.member, limit.rate))
        if allocation.needs_update(sub.assigned, wanted):
            sub.assigned = wanted
        sub.kind = "token_bucket"
        await self._push_others(stream, key, shares)
        metrics.QUOTA_ACTIONS.labels("token_bucket").inc()
        return Action(report.bucket_id, "token_bucket", sub.assigned, self.settings.assignment_ttl)

    async def _record(self, key: str, member: str, usage: Usage) -> dict[str, Usage]:
        """Every gateway's usage of the bucket; this process's when Redis cannot answer."""
        local = self._local.record_now(key, member, usage, self.settings.stale_after)
        if self._usage is None:
            return local
        try:
            view = await self._usage.record(key, member, usage, self.settings.stale_after)
        except StoreUnavailable as exc:
            if not self._store_down:
                self._store_down = True
                log.warning(
                    "quota usage store unreachable; allocating from this instance's gateways",
                    extra={"error": str(exc)},
                )
            return local
        if self._store_down:
            self._store_down = False
            log.info("quota usage store reachable again")
        return view

    async def _push_others(
        self, origin: QuotaStream, key: str, shares: Mapping[str, float]
    ) -> None:
        """Assignments may be pushed at any time: shrink (or grow) the other local
        gateways' shares of the bucket now rather than at their next report."""
        for other in list(self._subscribers.get(key, ())):
            sub = other.buckets.get(key)
            if other is origin or sub is None or sub.kind != "token_bucket":
                continue
            share = shares.get(other.member)
            if share is None:
                continue
            wanted = allocation.token_bucket(share)
            if not allocation.needs_update(sub.assigned, wanted):
                continue
            sub.assigned = wanted
            metrics.QUOTA_ACTIONS.labels("pushed").inc()
            action = Action(sub.bucket_id, "token_bucket", wanted, self.settings.assignment_ttl)
            try:
                await other.push([action])
            except Exception:  # the gateway left: its stream ends
                await self.close(other)

    def _subscribe(
        self, stream: QuotaStream, key: str, bucket_id: Mapping[str, str]
    ) -> _Subscription:
        """A new bucket of ``stream``; :class:`TooManyBuckets` past either cap."""
        size = _id_bytes(bucket_id)
        if len(stream.buckets) >= self.settings.max_buckets:
            raise TooManyBuckets(f"a stream may subscribe at most {self.settings.max_buckets}")
        if stream.bucket_bytes + size > self.settings.max_bucket_bytes:
            raise TooManyBuckets(
                f"a stream's bucket ids may hold at most {self.settings.max_bucket_bytes} bytes"
            )
        if self._bucket_bytes + size > self.settings.max_worker_bucket_bytes:
            raise TooManyBuckets(
                "this server's streams' bucket ids may hold at most "
                f"{self.settings.max_worker_bucket_bytes} bytes together"
            )
        sub = stream.buckets[key] = _Subscription(bucket_id)
        stream.bucket_bytes += size
        self._bucket_bytes += size
        self._subscribers.setdefault(key, set()).add(stream)
        return sub

    async def _unsubscribe(self, stream: QuotaStream, key: str) -> None:
        self._drop(stream, key)
        await self._forget(stream, key)

    def _drop(self, stream: QuotaStream, key: str) -> None:
        """The bookkeeping half of unsubscribing: no wait, so it cannot be cut short."""
        sub = stream.buckets.pop(key, None)
        if sub is not None:
            size = _id_bytes(sub.bucket_id)
            stream.bucket_bytes -= size
            self._bucket_bytes -= size
        subscribers = self._subscribers.get(key)
        if subscribers is not None:
            subscribers.discard(stream)
            if not subscribers:
                del self._subscribers[key]

    async def _forget(self, stream: QuotaStream, key: str) -> None:
        """``stream``'s demand for ``key`` is dropped from both views."""
        await self._local.forget(key, stream.member)
        if self._usage is not None:
            with contextlib.suppress(StoreUnavailable):
                await self._usage.forget(key, stream.member)

    async def drain(self) -> None:
        """A planned stop: every assignment again with a TTL of 0, then every stream ends."""
        self.draining = True
        for stream in list(self._streams):
            actions = [
                Action(sub.bucket_id, sub.kind, sub.assigned, 0)
                for sub in stream.buckets.values()
                if sub.kind is not None and sub.kind != "abandon"
            ]
            if actions:
                with contextlib.suppress(Exception):
                    await stream.push(actions)
            metrics.QUOTA_ACTIONS.labels("expire_on_drain").inc(len(actions))
            stream.ended.set()
        log.info("quota streams told to fall back (TTL 0)", extra={"streams": len(self._streams)})

    async def stop(self) -> None:
        for stream in list(self._streams):
            await self.close(stream)
        if self._usage is not None:
            await self._usage.close()


def _id_bytes(bucket_id: Mapping[str, str]) -> int:
    """What a bucket id costs against :attr:`QuotaSettings.max_bucket_bytes`."""
    return sum(len(k.encode()) + len(v.encode()) for k, v in bucket_id.items())
