"""envoyproxy/ratelimit's remaining config features, with the reference's semantics.

Each case is taken from the reference (commit f2fb157 of envoyproxy/ratelimit):

- ``quota_mode``: ``shouldRateLimitWorker`` in ``src/service/ratelimit.go``
  answers OVER_LIMIT when a non-quota descriptor is over its limit, or when
  every quota descriptor is; its ``integration-test/scripts/quota.sh`` on the
  quota part of ``examples/ratelimit/config/example.yaml`` (service_1 1/min,
  service_2 2/min, both in one request): two requests pass, the third is
  refused. The global switch is its ``QUOTA_MODE`` setting.
- ``metadata``: ``ratelimitToMetadata`` and ``mergeMetadata`` (same file),
  switched on by ``RESPONSE_DYNAMIC_METADATA``: the response's
  ``dynamic_metadata`` holds the domain, the descriptors and the merged
  metadata of the descriptors that passed (the first value of a key wins),
  which the example's Envoy reads as
  ``%DYNAMIC_METADATA(envoy.filters.http.ratelimit:metadata:service_with_quota:name)%``.
- ``hits_addend``: ``utils.GetHitsAddends``: a descriptor's own value when set
  (0 allowed: check only), else the request's, where 0 means 1.

All through the real gRPC service on a real socket; the store-dependent ones
on Redis and in memory. ``detailed_metric`` is in test_detailed_metrics.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from ratelimit.config import load_config
from ratelimit.decisions import decision_line
from ratelimit.plan import plan_request
from ratelimit.settings import Settings
from tests.ratelimit.conftest import (
    OK,
    OVER,
    T0,
    FakeClock,
    Harness,
    descriptor,
    request,
    serve_app,
    write_config,
)
from tests.support.redis_server import RedisServer

# The quota part of the reference's examples/ratelimit/config/example.yaml,
# with one ordinary rule beside it.
CONFIG = """\
domain: rl
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
    metadata:
      service_with_quota:
        name: "service_1"
  - key: service
    value: service_2
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
    metadata:
      service_with_quota:
        name: "service_2"
        tier: 2
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata: {client: {seen: true}}
  - key: open
    rate_limit: {unlimited: true}
"""

SERVICES = (descriptor(("service", "service_1")), descriptor(("service", "service_2")))


@pytest.fixture(params=["redis", "memory"])
async def svc(
    request: pytest.FixtureRequest, tmp_path: Path, redis: RedisServer
) -> AsyncIterator[tuple[Harness, FakeClock]]:
    clock = FakeClock()
    url = redis.url if request.param == "redis" else None
    settings = Settings(store_timeout=0.5, dynamic_metadata=True)
    async with serve_app(
        write_config(tmp_path, "rl.yaml", CONFIG), redis_url=url, settings=settings, clock=clock
    ) as harness:
        yield harness, clock


def metadata_of(response: Any) -> dict[str, Any]:
    return json_format.MessageToDict(response.dynamic_metadata)


async def test_quota_mode_denies_only_when_every_quota_descriptor_is_over(
    svc: tuple[Harness, FakeClock],
) -> None:
    harness, clock = svc
    quota = request("rl", *SERVICES)
    answers = [await harness.call(quota) for _ in range(3)]
    # quota.sh: service_1 (1/min) is over from the second request, but
    # service_2 (2/min) still passes; the third request finds both over.
    assert [a.overall_code for a in answers] == [OK, OK, OVER]
    assert [[s.code for s in a.statuses] for a in answers] == [
        [OK, OK],
        [OVER, OK],
        [OVER, OVER],
    ]
    assert [a.statuses[1].limit_remaining for a in answers] == [1, 0, 0]
    # The dynamic metadata names the service that still has quota: the
    # merge keeps the first passing descriptor's value of a key.
    names = [metadata_of(a).get("metadata", {}).get("service_with_quota") for a in answers]
    assert names == [{"name": "service_1", "tier": 2.0}, {"name": "service_2", "tier": 2.0}, None]
    # A non-quota descriptor over its limit denies whatever the quota ones say.
    assert (await harness.call(request("rl", [("client", "c")]))).overall_code == OK
    clock.advance(60)  # a new minute: every bucket is full again
    mixed = await harness.call(request("rl", *SERVICES, [("client", "c")]))
    assert mixed.overall_code == OK
    assert (await harness.call(request("rl", *SERVICES, [("client", "c")]))).overall_code == OVER


async def test_dynamic_metadata_has_the_reference_shape(svc: tuple[Harness, FakeClock]) -> None:
    harness, _ = svc
    override = descriptor(("service", "service_9"), hits=0)
    override.limit.requests_per_unit = 10
    override.limit.unit = 2  # MINUTE
    req = request("rl", SERVICES[1], [("client", "c")], [("open", "x")], override, hits=3)
    answer = await harness.call(req)
    # Costs 3: service_2 (2/min) and client (1/min) cannot cover them; service_2 is
    # a quota descriptor but the only one, so the request is over.
    assert answer.overall_code == OVER
    assert metadata_of(answer) == {
        "domain": "rl",
        "descriptors": [
            {"entries": ["service=service_2"]},
            {"entries": ["client=c"]},
            {"entries": ["open=x"]},
            {"entries": ["service=service_9"], "limit": "requests_per_unit:10 unit:MINUTE",
             "hitsAddend": 0.0},
        ],
        "hitsAddend": 3.0,
    }  # fmt: skip
    # Passing descriptors' metadata, merged: mappings under one key merge.
    answer = await harness.call(request("rl", SERVICES[1], [("client", "c")]))
    assert answer.overall_code == OK
    assert metadata_of(answer)["metadata"] == {
        "service_with_quota": {"name": "service_2", "tier": 2.0},
        "client": {"seen": True},
    }
    # An unknown domain still gets the request's part.
    unknown = await harness.call(request("elsewhere", [("a", "b")]))
    assert metadata_of(unknown) == {"domain": "elsewhere", "descriptors": [{"entries": ["a=b"]}]}


async def test_hits_addend_as_the_reference_reads_it(svc: tuple[Harness, FakeClock]) -> None:
    harness, _ = svc
    two = descriptor(("service", "service_2"))
    # The request's hits_addend 0 means 1.
    assert (await harness.call(request("rl", two, hits=0))).statuses[0].limit_remaining == 1
    # A descriptor's own 0 means "check only": nothing is taken.
    check = descriptor(("service", "service_2"), hits=0)
    assert (await harness.call(request("rl", check, hits=5))).statuses[0].limit_remaining == 1
    # Its own value wins over the request's.
    own = descriptor(("service", "service_2"), hits=1)
    assert (await harness.call(request("rl", own, hits=5))).statuses[0].limit_remaining == 0
    # The largest cost a limit could cover is accepted (and denied, too big)...
    most = descriptor(("service", "service_2"), hits=2**32 - 1)
    assert (await harness.call(request("rl", most))).overall_code == OVER
    # ...a bigger one is refused, naming the field.
    too_big = descriptor(("service", "service_2"), hits=2**32)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await harness.call(request("rl", descriptor(("client", "c")), too_big))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        "descriptors[1].hits_addend is 4294967296; at most 4294967295 is allowed"
    )


GLOBAL = """\
domain: plain
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: quiet
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
"""


async def test_the_global_switch_puts_every_descriptor_in_quota_mode(tmp_path: Path) -> None:
    settings = Settings(store_timeout=0.5, quota_mode=True)
    async with serve_app(write_config(tmp_path, "p.yaml", GLOBAL), settings=settings) as harness:
        both = request("plain", [("a", "x")], [("b", "x")])
        codes = [(await harness.call(both)).overall_code for _ in range(3)]
        assert codes == [OK, OK, OVER]
        # A descriptor no limit applies to is a quota descriptor that passed
        # (the reference counts it), so a request holding one is never over;
        # so is a request holding a shadow one.
        for passing in ([("unknown", "x")], [("quiet", "x")]):
            answer = await harness.call(request("plain", [("a", "x")], [("b", "x")], passing))
            assert answer.overall_code == OK
            assert [s.code for s in answer.statuses[:2]] == [OVER, OVER]
        # Without responseDynamicMetadata, no dynamic metadata.
        assert not (await harness.call(both)).HasField("dynamic_metadata")


def test_a_quota_hit_that_lets_the_request_through_is_logged_as_quota(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, "rl.yaml", CONFIG))
    plan = plan_request(config, request("rl", *SERVICES).SerializeToString(), T0)
    entries = [[("service", "service_1")], [("service", "service_2")]]

    def decision(over: bool, found: list[tuple[int, bool]]) -> object:
        line = decision_line(plan, entries, found, "id", T0, over=over, shown=lambda v: "***")
        return line["decision"]

    assert decision(False, [(0, False)]) == "quota"
    assert decision(False, [(0, True)]) == "shadow"
    assert decision(True, [(0, False), (1, False)]) == "over_limit"
