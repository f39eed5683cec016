"""The gRPC adapter: envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas.

Protos in, plain reports to :class:`~ratelimit.quota.service.QuotaService`,
its actions back out as ``RateLimitQuotaResponse`` messages; pushes from the
service (a share changed by another gateway) go out on the same stream,
serialized with the answers. What the protocol asks, and what happens
otherwise:

=============================================  ================================
first message without ``domain``               INVALID_ARGUMENT
a later message naming another ``domain``      INVALID_ARGUMENT (Envoy repeats
                                               the same one; empty is fine)
a message that does not parse, a bucket id     INVALID_ARGUMENT naming it
that is not a descriptor
more buckets than ``max_buckets``              RESOURCE_EXHAUSTED
silent for ``idle_timeout``                    the stream ends (OK)
drain (SIGTERM)                                every assignment with TTL 0, then OK
=============================================  ================================
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from envoy.service.rate_limit_quota.v3 import rlqs_pb2
from envoy.type.v3 import ratelimit_strategy_pb2
from google.protobuf.message import DecodeError

from meshplane.grpc_wire import Code, RpcError
from meshplane.server_contract import WorkerContext
from ratelimit.quota.buckets import InvalidBucket
from ratelimit.quota.service import (
    Action,
    BucketReport,
    QuotaService,
    QuotaStream,
    TooManyBuckets,
)

SERVICE_NAME = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService"
METHOD = "StreamRateLimitQuotas"

_ALLOW_ALL = ratelimit_strategy_pb2.RateLimitStrategy.ALLOW_ALL
_DENY_ALL = ratelimit_strategy_pb2.RateLimitStrategy.DENY_ALL


def encode(actions: Sequence[Action]) -> bytes:
    """One ``RateLimitQuotaResponse`` holding ``actions``."""
    response = rlqs_pb2.RateLimitQuotaResponse()
    for action in actions:
        item = response.bucket_action.add()
        item.bucket_id.bucket.update(action.bucket_id)
        if action.kind == "abandon":
            item.abandon_action.SetInParent()
            continue
        assignment = item.quota_assignment_action
        assignment.assignment_time_to_live.seconds = action.ttl
        strategy = assignment.rate_limit_strategy
        if action.kind == "token_bucket":
            assert action.token_bucket is not None
            bucket = strategy.token_bucket
            bucket.max_tokens = action.token_bucket.max_tokens
            bucket.tokens_per_fill.value = action.token_bucket.tokens_per_fill
            bucket.fill_interval.seconds = action.token_bucket.fill_interval
        else:
            strategy.blanket_rule = _ALLOW_ALL if action.kind == "allow_all" else _DENY_ALL
    return bytes(response.SerializeToString())


def decode(raw: bytes) -> tuple[str, list[BucketReport]]:
    """(domain, per-bucket usage) of one ``RateLimitQuotaUsageReports``."""
    try:
        message = rlqs_pb2.RateLimitQuotaUsageReports.FromString(raw)
    except DecodeError as exc:
        raise RpcError(Code.INVALID_ARGUMENT, f"unreadable usage report: {exc}") from None
    reports = [
        BucketReport(dict(u.bucket_id.bucket), u.num_requests_allowed, u.num_requests_denied)
        for u in message.bucket_quota_usages
    ]
    return message.domain, reports


class StreamRateLimitQuotasHandler:
    """One call per gateway stream (a :data:`meshplane.rpc.StreamHandler`)."""

    def __init__(self, service: QuotaService) -> None:
        self._service = service

    async def __call__(
        self, requests: AsyncIterator[bytes], send: Callable[[bytes], Awaitable[None]]
    ) -> None:
        if self._service.draining:
            raise RpcError(Code.UNAVAILABLE, "the server is shutting down")
        lock = asyncio.Lock()

        async def push(actions: Sequence[Action]) -> None:
            async with lock:  # answers and pushes never interleave on the wire
                await send(encode(actions))

        stream: QuotaStream | None = None
        try:
            stream = await self._first(requests, push)
            if stream is None:
                return
            consume = asyncio.ensure_future(self._consume(stream, requests, push))
            ended = asyncio.ensure_future(stream.ended.wait())
            try:
                await asyncio.wait({consume, ended}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                ended.cancel()
                if not consume.done():
                    consume.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await consume
            consume.result()
        finally:
            if stream is not None:
                await self._service.close(stream)

    async def _first(
        self, requests: AsyncIterator[bytes], push: Callable[[Sequence[Action]], Awaitable[None]]
    ) -> QuotaStream | None:
        """The first report opens the stream: it must name the domain."""
        async for raw in requests:
            domain, reports = decode(raw)
            if not domain:
                raise RpcError(Code.INVALID_ARGUMENT, "domain: required in the first message")
            if len(domain) > 1024:
                raise RpcError(Code.INVALID_ARGUMENT, "domain: longer than 1024 bytes")
            stream = self._service.open(domain, push)
            await self._answer(stream, reports, push)
            return stream
        return None

    async def _consume(
        self,
        stream: QuotaStream,
        requests: AsyncIterator[bytes],
        push: Callable[[Sequence[Action]], Awaitable[None]],
    ) -> None:
        idle = self._service.settings.idle_timeout
        iterator = aiter(requests)
        while True:
            try:
                async with asyncio.timeout(idle):
                    raw = await anext(iterator)
            except (StopAsyncIteration, TimeoutError):
                return
            domain, reports = decode(raw)
            if domain and domain != stream.domain:
                raise RpcError(
                    Code.INVALID_ARGUMENT,
                    f"domain: {domain!r} differs from the stream's {stream.domain!r}",
                )
            await self._answer(stream, reports, push)

    async def _answer(
        self,
        stream: QuotaStream,
        reports: list[BucketReport],
        push: Callable[[Sequence[Action]], Awaitable[None]],
    ) -> None:
        try:
            actions = await self._service.report(stream, reports)
        except InvalidBucket as exc:
            raise RpcError(Code.INVALID_ARGUMENT, f"bucket_id: {exc}") from None
        except TooManyBuckets as exc:
            raise RpcError(Code.RESOURCE_EXHAUSTED, str(exc)) from None
        if actions:
            await push(actions)


def register(service: QuotaService, ctx: WorkerContext) -> None:
    """Serve StreamRateLimitQuotas in a worker (every backend)."""
    ctx.add_stream(SERVICE_NAME, METHOD, StreamRateLimitQuotasHandler(service))
