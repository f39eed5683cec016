"""Matching rules of envoyproxy/ratelimit: exact, then wildcard, then key-only;
limits only at the request's depth; allow-list entries; per-value buckets."""

from __future__ import annotations

from pathlib import Path

import pytest

from ratelimit.config import DomainConfig, load_config, parse_domain, wildcard_pattern
from ratelimit.matching import glob_match, match_descriptor
from tests.ratelimit.conftest import write_config

# The reference's test/config/basic_config.yaml, plus wildcards.
BASIC = """\
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 30}
  - key: key2
    value: value3
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: key4
    rate_limit: {unit: day, requests_per_unit: 1, name: key4_rate_limit}
  - key: key6
    rate_limit: {unlimited: true}
  - key: wild
    value: "foo*"
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: wild
    value: "bar*b"
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: wild
    value: "foo*bar*baz"
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: wild
    value: "foo"
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: wild
    rate_limit: {unit: second, requests_per_unit: 99}
  - key: files
    value: "files/*"
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: nofiles
    value: "nofiles/*"
    rate_limit: {unit: hour, requests_per_unit: 10}
"""


@pytest.fixture(scope="module")
def domain(tmp_path_factory: pytest.TempPathFactory) -> DomainConfig:
    path = write_config(tmp_path_factory.mktemp("cfg"), "basic.yaml", BASIC)
    return load_config(path).domains["test-domain"]


def limit_of(domain: DomainConfig, *entries: tuple[str, str]) -> int | None:
    match = match_descriptor(domain, entries)
    return None if match is None else match.limit.requests_per_unit


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        ((("key1", "value1"),), None),  # no limit at depth 1
        ((("key1", "value1"), ("subkey1", "something")), 5),  # the default below
        ((("key1", "value1"), ("subkey1", "subvalue1")), 10),  # exact wins over default
        ((("key1", "value1"), ("subkey1", "x"), ("deeper", "x")), None),  # deeper than config
        ((("key1", "other"), ("subkey1", "subvalue1")), None),  # no match at level 1
        ((("key2", "anything"),), 20),
        ((("key2", "value2"),), 30),
        ((("key2", "value3"),), None),  # allow-listed: matches, no limit, no default
        ((("key3", "x"),), 1),
        ((("nokey", "x"),), None),
        ((("wild", "foo1"),), 1),  # foo* (first wildcard in config order)
        ((("wild", "barb"),), 2),
        ((("wild", "bar123b"),), 2),
        ((("wild", "bara"),), 99),  # no wildcard matches: key-only default
        ((("wild", "xbarb"),), 99),
        ((("wild", "foobarbaz"),), 1),  # foo* comes first in config order
        ((("wild", "foo"),), 4),  # exact beats wildcard
    ],
)
def test_reference_matching_rules(
    domain: DomainConfig, entries: tuple[tuple[str, str], ...], expected: int | None
) -> None:
    assert limit_of(domain, *entries) == expected


def wildcard_domain(tmp_path: Path, pattern: str) -> DomainConfig:
    """Domain ``w``: 3 a second for key ``k`` with a value matching ``pattern``."""
    cfg = load_config(
        write_config(
            tmp_path,
            "w.yaml",
            f"""\
            domain: w
            descriptors:
              - key: k
                value: "{pattern}"
                rate_limit: {{unit: second, requests_per_unit: 3}}
            """,
        )
    )
    return cfg.domains["w"]


def test_wildcard_in_the_middle(tmp_path: Path) -> None:
    cfg = wildcard_domain(tmp_path, "foo*bar*baz")
    assert limit_of(cfg, ("k", "foobarbaz")) == 3
    assert limit_of(cfg, ("k", "foo-x-bar-y-baz")) == 3
    assert limit_of(cfg, ("k", "foo123baz")) is None


GLOB_PATTERNS = ["*", "a*", "*a", "a*b", "*a*", "a*a", "*a*b*c*", "ab*ba", "**", "a**b", "x"]
GLOB_VALUES = ["", "a", "b", "ab", "ba", "aa", "aba", "abba", "abcabc", "cba", "xa*b", "x", "a*b"]


@pytest.mark.parametrize("pattern", GLOB_PATTERNS)
def test_glob_matching_agrees_with_the_wildcard_regex(pattern: str) -> None:
    regex = wildcard_pattern(pattern)
    for value in GLOB_VALUES:
        assert glob_match(pattern, value) is bool(regex.fullmatch(value)), value


def test_a_hostile_value_cannot_make_a_wildcard_backtrack(tmp_path: Path) -> None:
    """``*a*b*c*`` against 64 KiB of "ab": the regex took minutes at 16 KB."""
    cfg = wildcard_domain(tmp_path, "*a*b*c*")
    assert limit_of(cfg, ("k", "ab" * 32768)) is None
    assert limit_of(cfg, ("k", "ab" * 32768 + "c")) == 3


def test_named_and_unlimited_limits(domain: DomainConfig) -> None:
    match = match_descriptor(domain, [("key4", "v")])
    assert match is not None and match.limit.name == "key4_rate_limit"
    unl = match_descriptor(domain, [("key6", "v")])
    assert unl is not None and unl.limit.unlimited


def test_key_only_gives_each_value_its_own_bucket(domain: DomainConfig) -> None:
    a = match_descriptor(domain, [("key2", "alice")])
    b = match_descriptor(domain, [("key2", "bob")])
    assert a is not None and b is not None
    assert a.limit is b.limit
    assert a.bucket_path != b.bucket_path


def test_share_threshold_shares_one_bucket_per_pattern(domain: DomainConfig) -> None:
    a = match_descriptor(domain, [("files", "files/a.pdf")])
    b = match_descriptor(domain, [("files", "files/b.csv")])
    assert a is not None and b is not None and a.bucket_path == b.bucket_path
    c = match_descriptor(domain, [("nofiles", "nofiles/a")])
    d = match_descriptor(domain, [("nofiles", "nofiles/b")])
    assert c is not None and d is not None and c.bucket_path != d.bucket_path


def test_value_to_metric_key_is_the_references() -> None:
    """``GetLimit``'s value_to_metric key: the request's value where the flag is
    set on a key-only or wildcard entry, the pattern with share_threshold."""
    config = parse_domain(
        """\
domain: v
descriptors:
  - key: route
    value: "api*"
    value_to_metric: true
    descriptors:
      - key: user
        value_to_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
      - key: team
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: files
    value: "f*"
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 5}
""",
        "v.yaml",
    )
    keys = [
        match.value_metric
        for entries in (
            [("route", "api/v1"), ("user", "u1")],
            [("route", "api/v1"), ("team", "t1")],
            [("files", "f/x")],
            [("plain", "p")],
        )
        if (match := match_descriptor(config, entries)) is not None
    ]
    assert keys == ["route_api/v1.user_u1", "route_api/v1.team", "files_f*", None]
