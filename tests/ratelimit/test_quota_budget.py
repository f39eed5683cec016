"""ratelimit.quota.service.QuotaService: the bucket ids of every stream of a worker
share one byte budget, and a stream that ends gives its share back.

The per-stream caps, and how a refusal reaches the gateway (RESOURCE_EXHAUSTED
ending its stream), are tests/ratelimit/test_quota_stream.py's; here the
worker-wide budget, on the service itself with a small one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from ratelimit.config import RateLimitConfig, load_config
from ratelimit.quota.service import (
    Action,
    BucketReport,
    QuotaService,
    QuotaSettings,
    QuotaStream,
    TooManyBuckets,
)
from ratelimit.quota.usage import MemoryUsage, UsageStore

CONFIG = """\
domain: gw
descriptors:
  - key: route
    rate_limit: {unit: second, requests_per_unit: 10}
"""
ID_BYTES = len("domain") + len("gw") + len("0:route") + len("r000")  # one bucket id below


async def _ignore(_actions: Sequence[Action]) -> None:
    """The stream's push: nothing is listening in these tests."""


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> RateLimitConfig:
    path = tmp_path_factory.mktemp("quota") / "gw.yaml"
    path.write_text(CONFIG)
    return load_config(path)


class HangingUsage(MemoryUsage):
    """A usage store whose ``forget`` never returns (a Redis that stopped answering)."""

    async def forget(self, bucket: str, member: str) -> None:
        await asyncio.Event().wait()


def _service(
    config: RateLimitConfig, worker_buckets: int, usage: UsageStore | None = None
) -> QuotaService:
    settings = QuotaSettings(max_worker_bucket_bytes=worker_buckets * ID_BYTES)
    return QuotaService(lambda: config, usage, settings=settings, clock=lambda: 1000.0)


def _report(*numbers: int) -> list[BucketReport]:
    return [BucketReport({"domain": "gw", "0:route": f"r{n:03d}"}, 1, 0) for n in numbers]


async def _subscribe(service: QuotaService, stream: QuotaStream, *numbers: int) -> None:
    for number in numbers:  # one at a time: a refusal names the bucket that did not fit
        await service.report(stream, _report(number))


async def test_a_workers_streams_share_one_budget_and_an_ended_stream_frees_its_part(
    config: RateLimitConfig,
) -> None:
    service = _service(config, worker_buckets=5)
    first, second = service.open("gw", _ignore), service.open("gw", _ignore)
    await _subscribe(service, first, 0, 1, 2)
    await _subscribe(service, second, 3, 4)
    assert service.bucket_bytes == 5 * ID_BYTES
    with pytest.raises(TooManyBuckets, match=r"may hold at most \d+ bytes together"):
        await _subscribe(service, second, 5)
    # Buckets already held are still answered.
    assert [a.kind for a in await service.report(second, _report(3, 4))] == ["token_bucket"] * 2
    await service.close(first)
    assert service.bucket_bytes == 2 * ID_BYTES
    await _subscribe(service, second, 5, 6, 7)
    assert service.bucket_bytes == 5 * ID_BYTES


async def test_a_close_cut_short_still_gives_every_bucket_back(config: RateLimitConfig) -> None:
    service = _service(config, worker_buckets=10, usage=HangingUsage())
    stream = service.open("gw", _ignore)
    await _subscribe(service, stream, 0, 1, 2, 3)
    closing = asyncio.ensure_future(service.close(stream))
    await asyncio.sleep(0)  # the close runs until the store's forget hangs
    assert not closing.done()
    closing.cancel()  # as at shutdown
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert service.bucket_bytes == 0
