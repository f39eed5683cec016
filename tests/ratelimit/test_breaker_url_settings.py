"""Pure pieces around the store: the circuit breaker, the Redis URL, settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshplane.config_error import ConfigError
from ratelimit.breaker import BreakerState, CircuitBreaker
from ratelimit.redis_url import RedisUrlError, parse_redis_url, redact
from ratelimit.settings import Settings, load_settings


def state_of(breaker: CircuitBreaker) -> BreakerState:
    """The breaker's state now. (Reading ``breaker.state`` inline, mypy would keep it
    narrowed by the previous assert across the calls that change it.)"""
    return breaker.state


def test_breaker_opens_after_threshold_and_lets_one_trial_through() -> None:
    b = CircuitBreaker(failure_threshold=2, open_seconds=1.0, min_streak_seconds=0.0)
    assert b.allow(0.0)
    assert not b.record_failure(0.0)
    assert state_of(b) is BreakerState.CLOSED and b.allow(0.1)
    assert b.record_failure(0.1)  # True: this failure opened it (the store drops its connections)
    assert state_of(b) is BreakerState.OPEN and not b.closed
    assert not b.record_failure(0.15)  # a late failure of a call already in flight: no new opening
    assert not b.allow(0.5)
    assert b.allow(1.2)  # the trial
    assert not b.allow(1.2)  # only one trial at a time
    assert b.record_failure(1.3)  # the trial failed: open again
    assert not b.allow(1.4)
    assert b.allow(2.4)
    assert not b.closed  # half-open
    b.record_success()
    assert state_of(b) is BreakerState.CLOSED and b.closed and b.allow(2.5) and b.allow(2.5)


def test_breaker_ignores_a_short_burst_of_failures() -> None:
    b = CircuitBreaker(failure_threshold=3, open_seconds=1.0, min_streak_seconds=0.25)
    for t in (10.0, 10.001, 10.002, 10.003):  # a blip: many failures within 3 ms
        b.record_failure(t)
    assert state_of(b) is BreakerState.CLOSED
    b.record_success()
    for t in (11.0, 11.1, 11.2):
        b.record_failure(t)
    assert state_of(b) is BreakerState.CLOSED  # 0.2 s of failures: not yet
    b.record_failure(11.3)
    assert state_of(b) is BreakerState.OPEN and not b.allow(11.4)


@pytest.mark.parametrize(
    ("url", "mode", "hosts", "tls", "db", "master", "user", "password"),
    [
        (
            "redis://localhost:6380/2",
            "standalone",
            (("localhost", 6380),),
            False,
            2,
            None,
            None,
            None,
        ),
        ("rediss://u:p%40ss@h", "standalone", (("h", 6379),), True, 0, None, "u", "p@ss"),
        ("redis://secret@h:1", "standalone", (("h", 1),), False, 0, None, None, "secret"),
        (
            "redis+sentinel://:pw@s1:26379,s2/mymaster/3",
            "sentinel",
            (("s1", 26379), ("s2", 26379)),
            False,
            3,
            "mymaster",
            None,
            "pw",
        ),
        (
            "rediss+cluster://a:7000,[::1]:7001",
            "cluster",
            (("a", 7000), ("::1", 7001)),
            True,
            0,
            None,
            None,
            None,
        ),
    ],
)
def test_redis_urls(
    url: str,
    mode: str,
    hosts: tuple[tuple[str, int], ...],
    tls: bool,
    db: int,
    master: str | None,
    user: str | None,
    password: str | None,
) -> None:
    t = parse_redis_url(url)
    assert (t.mode, t.hosts, t.tls, t.db, t.master_name, t.username, t.password) == (
        mode,
        hosts,
        tls,
        db,
        master,
        user,
        password,
    )
    assert "p@ss" not in repr(t) and "secret" not in repr(t)


def test_redis_url_tls_options_and_errors() -> None:
    t = parse_redis_url("rediss://h?ssl_ca_certs=/ca.pem&ssl_cert_reqs=none&sentinel_password=x")
    assert (t.ssl_ca_certs, t.ssl_cert_reqs, t.sentinel_password) == ("/ca.pem", "none", "x")
    for bad in (
        "http://h",
        "redis://a,b",
        "redis+sentinel://h",
        "redis://h?bogus=1",
        "redis://h:99999",
        "redis+cluster://h/1",
    ):
        with pytest.raises(RedisUrlError):
            parse_redis_url(bad)


def test_redact_hides_passwords() -> None:
    assert redact("rediss://user:hunter2@h:6379/0") == "rediss://user:***@h:6379/0"
    assert redact("redis://hunter2@h") == "redis://***@h"
    assert "hunter2" not in redact("redis+sentinel://h/m?sentinel_password=hunter2")


def test_settings_file(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "failureMode: deny\nstoreTimeoutMs: 5\nlocalCacheSize: 0\n"
        "headers: {enabled: true, limit: RateLimit-Limit}\nbreaker: {failures: 2}\n"
    )
    s = load_settings(path)
    assert (s.failure_mode, s.store_timeout, s.local_cache_size, s.breaker_failures) == (
        "deny",
        0.005,
        0,
        2,
    )
    assert s.header_names.limit == "ratelimit-limit"
    assert s.header_names.reset == Settings().header_names.reset
    path.write_text("failureMode: open\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert (info.value.line, info.value.field) == (1, "failureMode")


def test_pipelining_settings(tmp_path: Path) -> None:
    """On by default (it only holds writes when that pays); 0 turns it off."""
    assert (Settings().redis_pipeline_window, Settings().redis_pipeline_limit) == (0.0005, 0)
    path = tmp_path / "s.yaml"
    path.write_text("redisPipelineWindowUs: 0\nredisPipelineLimit: 32\n")
    s = load_settings(path)
    assert (s.redis_pipeline_window, s.redis_pipeline_limit) == (0.0, 32)
    path.write_text("redisPipelineWindowUs: 150\nredisPipelineLimit: -1\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert (info.value.line, info.value.field) == (2, "redisPipelineLimit")
    # A window that would eat the store timeout is refused.
    path.write_text("storeTimeoutMs: 5\nredisPipelineWindowUs: 3000\n")
    with pytest.raises(ConfigError, match="at most half of storeTimeoutMs") as info:
        load_settings(path)
    assert (info.value.line, info.value.field) == (2, "redisPipelineWindowUs")


def test_quota_settings(tmp_path: Path) -> None:
    """The RLQS TTL and staleness: 15 s by default, never within one report's gap (5 s)."""
    assert (Settings().quota_assignment_ttl, Settings().quota_stale_after) == (15, 15)
    path = tmp_path / "s.yaml"
    path.write_text("quota:\n  assignmentTtlSeconds: 10\n  staleAfterSeconds: 7.5\n")
    s = load_settings(path)
    assert (s.quota_assignment_ttl, s.quota_stale_after) == (10, 7.5)
    for text, line, field in [
        ("quota: {assignmentTtlSeconds: 5}\n", 1, "quota.assignmentTtlSeconds"),
        ("quota: {assignmentTtlSeconds: 10.5}\n", 1, "quota.assignmentTtlSeconds"),
        ("quota:\n  staleAfterSeconds: 5\n", 2, "quota.staleAfterSeconds"),
        ("quota: {reportSeconds: 1}\n", 1, "quota.reportSeconds"),
    ]:
        path.write_text(text)
        with pytest.raises(ConfigError) as info:
            load_settings(path)
        assert (info.value.line, info.value.field) == (line, field), text


def test_redis_url_precedence_flag_env_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ratelimit.cli import resolve_redis_url

    secret_file = tmp_path / "url"
    secret_file.write_text("redis://from-file:6379/0\n")
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("REDIS_URL_FILE", raising=False)
    assert resolve_redis_url(None, None) is None
    monkeypatch.setenv("REDIS_URL_FILE", str(secret_file))
    assert resolve_redis_url(None, None) == "redis://from-file:6379/0"
    monkeypatch.setenv("REDIS_URL", "redis://from-env:6379/0")
    assert resolve_redis_url(None, None) == "redis://from-env:6379/0"
    assert resolve_redis_url("redis://from-flag:1", None) == "redis://from-flag:1"
    monkeypatch.delenv("REDIS_URL")
    with pytest.raises(ConfigError, match="cannot read the Redis URL file"):
        resolve_redis_url(None, str(tmp_path / "missing"))


def test_cli_refuses_several_workers_without_redis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ratelimit.cli import main

    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("REDIS_URL_FILE", raising=False)
    config = tmp_path / "c.yaml"
    config.write_text("domain: d\ndescriptors: [{key: k}]\n")
    assert main(["serve", "--config", str(config), "--workers", "2"]) == 2
    assert "--workers > 1 needs Redis" in capsys.readouterr().err
    assert main(["check", "--config", str(config)]) == 0


def test_script_calls_are_packed_like_any_command() -> None:
    """The hot path writes EVALSHA (and EVAL after NOSCRIPT) out by hand; it
    must be byte for byte what the generic RESP encoder gives."""
    from ratelimit.buckets import Bucket, window_at
    from ratelimit.store.redis import (
        _EVAL_HEAD,
        _EVALSHA_HEAD,
        DECIDE_SCRIPT,
        DECIDE_SHA,
        _script_body,
        _script_call,
    )
    from ratelimit.store.resp import pack

    now = 1_800_000_010.25
    buckets = [
        Bucket("rl:{t}:60:a", 5, 2, window_at(60, now), False),
        Bucket("rl:{t}:3600:b", 3, 0, window_at(3600, now), True),
        Bucket("rl:{t}:30s:c", 4, 1, window_at(30, now), False, "rl:{t}:30s:p"),
    ]
    # Per key: limit, cost, window end (epoch ms), shadow, sliding window (ms);
    # then now (epoch ms). The previous window's keys follow the buckets' keys.
    args = [
        *(5, 2, 1_800_000_060_000, 0, 0),
        *(3, 0, 1_800_003_600_000, 1, 0),
        *(4, 1, 1_800_000_030_000, 0, 30_000),
        1_800_000_010_250,
    ]
    keys = [*(b.key for b in buckets), "rl:{t}:30s:p"]
    assert _script_call(_EVALSHA_HEAD, buckets, now) == pack(
        ["EVALSHA", DECIDE_SHA, 4, *keys, *args]
    )
    assert _script_call(_EVALSHA_HEAD, buckets, now, _script_body(buckets)) == pack(
        ["EVALSHA", DECIDE_SHA, 4, *keys, *args]
    )
    assert _script_call(_EVAL_HEAD, buckets, now) == pack(["EVAL", DECIDE_SCRIPT, 4, *keys, *args])
