"""No piece of a Redis password ever reaches an error message or a redacted URL.

A password with an unencoded ``/``, ``?``, ``@`` or ``:`` shifts how the URL
splits, so its fragments land where a host, a port, a path or a parameter
name is expected; an error that quotes "the bad port" or "the bad path" then
prints part of the secret (``redis://user:hunter/2@h`` once gave
``invalid port in 'user:hunter'``). These tests build URLs around passwords
made of letters that appear in no message, host or user name (``SECRET``)
mixed with every separator, and check that none of those letters comes out:
not in parse errors, not in the switch validation that NACKs a snapshot,
not in :func:`redact`.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshplane.config_error import ConfigError
from ratelimit.redis_url import RedisUrlError, parse_redis_url, redact
from ratelimit.store.switches import SECRETS_DIR_ENV, parse_switches

SECRET = "QJXZVWK"  # in no message of redis_url/switches, no host, no user below
SEPARATORS = "/?#@:%&=[],;+ !$'()*"
passwords = st.text(alphabet=SECRET + SEPARATORS + "0123456789", min_size=1, max_size=24).filter(
    lambda pw: any(c in SECRET for c in pw)
)
TEMPLATES = [
    "redis://{userinfo}@127.0.0.1:6379/0",
    "rediss://{userinfo}@cache.example:6380",
    "redis+sentinel://{userinfo}@s1:26379,s2/mymaster/1",
    "redis+cluster://{userinfo}@n1:7000,n2:7001",
    "redis://127.0.0.1:6379/0?sentinel_password={password}",
]


def leaked(text: str) -> set[str]:
    return {c for c in text if c in SECRET}


def urls(password: str) -> list[str]:
    """URLs with the password left unencoded. In the password-alone form a
    ":" must still be encoded: by the URL standard whatever precedes it is
    the user name (shown in logs), so no parser could tell it apart."""
    out = []
    alone = password.replace(":", "%3A")
    for template in TEMPLATES:
        for userinfo in (f"user:{password}", f":{password}", alone):
            out.append(template.format(userinfo=userinfo, password=password))
    return out


def test_the_audited_examples() -> None:
    with pytest.raises(RedisUrlError) as info:
        parse_redis_url("redis://user:hunter/2@h")
    assert "hunter" not in str(info.value)
    assert "percent-encoded" in str(info.value)
    assert redact("redis://user:hunter/2@h") == "redis://***"
    # An "@" left after the host part is the tail of a password, never a master name.
    with pytest.raises(RedisUrlError):
        parse_redis_url("redis+sentinel://u:1234/secret@x/mymaster")
    assert redact("redis+sentinel://u:1234/secret@x/mymaster") == "redis+sentinel://***"
    assert redact("not a url hunter2") == "***"
    assert redact("hunter2://x") == "***"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(passwords)
def test_no_password_fragment_in_errors_or_redacted_urls(password: str) -> None:
    for url in urls(password):
        try:
            target = parse_redis_url(url)
        except RedisUrlError as exc:
            assert not leaked(str(exc)), (url, str(exc))
        else:
            assert not leaked(repr(target)), (url, repr(target))
        assert not leaked(redact(url)), (url, redact(url))


@settings(max_examples=100, deadline=None)
@given(passwords)
def test_percent_encoded_passwords_round_trip(password: str) -> None:
    """Encoded, any password parses back exactly and is redacted whole."""
    url = f"redis://user:{quote(password, safe='')}@127.0.0.1:6379/0"
    assert parse_redis_url(url).password == password
    assert redact(url) == "redis://user:***@127.0.0.1:6379/0"


@settings(max_examples=100, deadline=None)
@given(passwords)
def test_no_password_fragment_in_switch_errors(password: str) -> None:
    """The snapshot validation that NACKs a cluster switch logs its message."""
    for url in urls(password):
        try:
            parse_switches({"rateLimit": {"backend": {"redis": {"url": url}}}})
        except ConfigError as exc:
            assert not leaked(str(exc)), (url, str(exc))


def test_no_password_fragment_in_switch_errors_with_a_certificate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With tls.certificateRef the URL is also split by urllib, whose own
    errors (e.g. on a "[") must not come out either."""
    (tmp_path / "mesh" / "rl-ca").mkdir(parents=True)
    (tmp_path / "mesh" / "rl-ca" / "ca.crt").write_text("not checked here")
    monkeypatch.setenv(SECRETS_DIR_ENV, str(tmp_path))
    for password in ("QJ/X[Z", "QJX?Z@W", "Q]J[X:Z", "QJ%XZ#V"):
        for url in urls(password):
            redis = {"url": url, "tls": {"certificateRef": {"name": "rl-ca", "namespace": "mesh"}}}
            try:
                parse_switches({"rateLimit": {"backend": {"redis": redis}}})
            except ConfigError as exc:
                assert not leaked(str(exc)), (url, str(exc))
