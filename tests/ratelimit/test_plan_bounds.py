"""What one request may cost, in pure logic: the request caps, the plan cache's
byte bound and recency order, the response template's size, and the settings
that set them. (Through real sockets on both servers: test_request_caps.py.)"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshplane.config_error import ConfigError
from ratelimit import plan as plan_module
from ratelimit.config import RateLimitConfig, load_config
from ratelimit.headers import HeaderNames
from ratelimit.plan import InvalidRequest, Plan, PlanBounds, plan_request
from ratelimit.response import encode_response
from ratelimit.settings import Settings, load_settings
from ratelimit.store import decide
from tests.ratelimit.conftest import T0, descriptor, request, write_config

CONFIG = """\
domain: d
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: user
    rate_limit: {unit: second, requests_per_unit: 5}
"""


@pytest.fixture
def config(tmp_path: Path) -> RateLimitConfig:
    return load_config(write_config(tmp_path, "d.yaml", CONFIG))


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    """The plan cache is per process: every test starts with an empty one."""
    plan_module._plan_cache.config = None
    yield
    plan_module._plan_cache.config = None


def raw(*descriptors: list[tuple[str, str]], domain: str = "d") -> bytes:
    return bytes(request(domain, *descriptors).SerializeToString())


def clients(count: int, start: int = 0) -> list[bytes]:
    return [raw([("client", f"c{i:06d}")]) for i in range(start, start + count)]


def cached() -> list[bytes]:
    return list(plan_module._plan_cache.plans)


# --- the caps, at the boundary -------------------------------------------------

BOUNDS = PlanBounds(max_descriptors=4, max_entries=3, max_value_bytes=12)
CAP_CASES = [
    # (what, at the cap, one above it, the message above it)
    (
        "descriptors",
        raw(*[[("client", f"c{i}")] for i in range(4)]),
        raw(*[[("client", f"c{i}")] for i in range(5)]),
        "the request has 5 descriptors; at most 4 are allowed",
    ),
    (
        "entries",
        raw([("a", "1"), ("b", "2"), ("c", "3")]),
        raw([("client", "x")], [("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")]),
        "descriptors[1] has 4 entries; at most 3 are allowed",
    ),
    (
        "value bytes",
        raw([("client", "v" * 12)]),
        raw([("client", "v" * 13)]),
        "descriptors[0].entries[0] value is 13 bytes long; at most 12 are allowed",
    ),
    (
        "value bytes, counted in UTF-8",
        raw([("client", "€" * 4)]),  # 12 bytes
        raw([("client", "€" * 4 + "v")]),
        "descriptors[0].entries[0] value is 13 bytes long; at most 12 are allowed",
    ),
    (
        "key bytes",
        raw([("k" * 12, "v")]),
        raw([("client", "v"), ("k" * 13, "v")]),
        "descriptors[0].entries[1] key is 13 bytes long; at most 12 are allowed",
    ),
    (
        "domain bytes",
        raw([("client", "v")], domain="d" * 12),
        raw([("client", "v")], domain="d" * 13),
        "the domain is 13 bytes long; at most 12 are allowed",
    ),
]


@pytest.mark.parametrize(
    ("at_cap", "above", "message"), [c[1:] for c in CAP_CASES], ids=[c[0] for c in CAP_CASES]
)
def test_caps_at_the_boundary(
    config: RateLimitConfig, at_cap: bytes, above: bytes, message: str
) -> None:
    plan_request(config, at_cap, T0, bounds=BOUNDS)
    with pytest.raises(InvalidRequest) as info:
        plan_request(config, above, T0, bounds=BOUNDS)
    assert str(info.value) == message
    assert above not in cached()


def test_default_caps_are_the_documented_ones() -> None:
    bounds = PlanBounds()
    assert (bounds.max_descriptors, bounds.max_entries, bounds.max_value_bytes) == (
        256,
        32,
        65536,
    )
    assert (bounds.cache_bytes, bounds.cache_entry_bytes) == (32 << 20, 16 << 10)


# --- the plan cache --------------------------------------------------------------


def test_the_plan_cache_stays_within_its_bytes_and_drops_the_least_recently_used(
    config: RateLimitConfig,
) -> None:
    requests = clients(200)
    entry = plan_module._entry_size(requests[0], plan_request(config, requests[0], T0))
    bounds = PlanBounds(cache_bytes=entry * 50, cache_entry_bytes=entry)
    for r in requests[:50]:
        plan_request(config, r, T0, bounds=bounds)
    assert cached() == requests[:50]
    plan_request(config, requests[0], T0, bounds=bounds)  # a hit: now the most recent
    for r in requests[50:60]:
        plan_request(config, r, T0, bounds=bounds)
    # The ten least recently used went, the first request (used again) stayed.
    assert cached() == [*requests[11:50], requests[0], *requests[50:60]]
    for r in requests[60:]:
        plan_request(config, r, T0, bounds=bounds)
    assert len(cached()) == 50
    assert plan_module._plan_cache.size == sum(
        e.size for e in plan_module._plan_cache.plans.values()
    )
    assert plan_module._plan_cache.size <= bounds.cache_bytes


def test_a_hit_is_the_same_plan_and_a_request_too_big_to_cache_is_planned_every_time(
    config: RateLimitConfig,
) -> None:
    small, big = raw([("client", "c1")]), raw([("client", "c" * 2000)])
    bounds = PlanBounds(cache_entry_bytes=plan_module._entry_size(small, _plan(config, small)))
    first = plan_request(config, small, T0, bounds=bounds)
    assert plan_request(config, small, T0, bounds=bounds) is first
    assert plan_request(config, big, T0, bounds=bounds) is not plan_request(
        config, big, T0, bounds=bounds
    )
    assert cached() == [small]


def test_an_entry_whose_window_ended_is_replaced_not_added(config: RateLimitConfig) -> None:
    r = raw([("user", "u1")])  # a one-second window
    first = plan_request(config, r, T0)
    later = plan_request(config, r, T0 + 1)
    assert later is not first
    assert later.buckets[0].window.start == first.buckets[0].window.start + 1
    assert cached() == [r]
    assert plan_module._plan_cache.size == plan_module._entry_size(r, later)


def test_an_unknown_domain_is_not_cached(config: RateLimitConfig) -> None:
    plan_request(config, raw([("client", "c")], domain="nope"), T0)
    assert cached() == []


def test_new_bounds_start_an_empty_cache(config: RateLimitConfig) -> None:
    plan_request(config, raw([("client", "c")]), T0)
    plan_request(config, raw([("client", "d")]), T0, bounds=PlanBounds(max_entries=5))
    assert cached() == [raw([("client", "d")])]


def test_cached_values_are_counted_with_the_request_bytes(config: RateLimitConfig) -> None:
    short, long = raw([("client", "c")]), raw([("client", "c" * 5000)])
    assert plan_module._entry_size(long, _plan(config, long)) - plan_module._entry_size(
        short, _plan(config, short)
    ) == len(long) - len(short)


def _plan(config: RateLimitConfig, raw_request: bytes) -> Plan:
    plan_module._plan_cache.config = None
    return plan_request(config, raw_request, T0)


# --- the response template -----------------------------------------------------


def _template_bytes(config: RateLimitConfig, descriptors: int) -> int:
    """Traced bytes that answering one request of ``descriptors`` limited
    descriptors keeps (its plan, with the template in its memo)."""
    req = request("d")
    for i in range(descriptors):
        req.descriptors.append(descriptor(("client", f"10.1.{i // 256}.{i % 256}")))
    raw_request = bytes(req.SerializeToString())
    bounds = PlanBounds(max_descriptors=descriptors, cache_entry_bytes=1 << 30)
    gc.collect()
    tracemalloc.start()
    try:
        plan = plan_request(config, raw_request, T0, bounds=bounds)
        outcome = decide(plan.buckets, [0] * len(plan.buckets))
        before = tracemalloc.get_traced_memory()[0]
        encode_response(plan, outcome, T0, headers=HeaderNames())
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_a_template_grows_linearly_with_the_descriptors(config: RateLimitConfig) -> None:
    """One x-ratelimit-limit header per descriptor, each listing every limit,
    made the template quadratic: 10,000 descriptors held over 1 GB."""
    small, large = _template_bytes(config, 250), _template_bytes(config, 1000)
    assert large < 4.0 * small * 1.5  # linear: x4; quadratic was x16


# --- the settings ----------------------------------------------------------------


def test_request_and_plan_cache_settings(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "requests: {maxDescriptors: 8, maxEntries: 4, maxValueBytes: 100}\n"
        "planCache: {maxBytes: 1048576, maxEntryBytes: 2048}\n"
    )
    s = load_settings(path)
    assert (s.max_descriptors, s.max_entries, s.max_value_bytes) == (8, 4, 100)
    assert (s.plan_cache_bytes, s.plan_cache_entry_bytes) == (1 << 20, 2048)
    defaults = Settings()
    assert (defaults.max_descriptors, defaults.max_entries, defaults.max_value_bytes) == (
        256,
        32,
        65536,
    )


@pytest.mark.parametrize(
    ("text", "line", "field", "message"),
    [
        ("requests: {maxDescriptors: 0}\n", 1, "requests.maxDescriptors", "integer from 1 to 4096"),
        ("requests:\n  maxEntries: 1025\n", 2, "requests.maxEntries", "integer from 1 to 1024"),
        ("requests: {maxValueBytes: 1.5}\n", 1, "requests.maxValueBytes", "an integer"),
        ("requests: {maxKeys: 3}\n", 1, "requests.maxKeys", "unknown key"),
        ("requests: 3\n", 1, "requests", "must be a mapping"),
        ("planCache: {maxBytes: -1}\n", 1, "planCache.maxBytes", "integer from 0 to"),
        (
            "planCache: {maxBytes: 1000, maxEntryBytes: 1001}\n",
            1,
            "planCache.maxEntryBytes",
            "must be at most planCache.maxBytes",
        ),
    ],
)
def test_bad_request_and_plan_cache_settings(
    tmp_path: Path, text: str, line: int, field: str, message: str
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        load_settings(path)
    assert (info.value.line, info.value.field) == (line, field)


def test_the_example_settings_file_states_the_defaults() -> None:
    path = Path(__file__).resolve().parents[2] / "deploy/ratelimit/settings.yaml"
    assert load_settings(path) == Settings()
