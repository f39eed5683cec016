"""The cluster's counter-store switch: a TLS certificate goes with every TLS topology."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from meshplane.config_error import ConfigError
from ratelimit.redis_url import parse_redis_url
from ratelimit.store.switches import SECRETS_DIR_ENV, parse_switches

_CERT = {"certificateRef": {"name": "rl-ca", "namespace": "mesh"}}


@pytest.fixture
def ca_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A mounted Secret ``mesh/rl-ca`` holding ``ca.crt``."""
    ca = tmp_path / "mesh" / "rl-ca" / "ca.crt"
    ca.parent.mkdir(parents=True)
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv(SECRETS_DIR_ENV, str(tmp_path))
    return ca


@pytest.mark.parametrize(
    "url",
    [
        "rediss://redis.mesh:6380/0",
        "rediss+sentinel://s1:26379,s2:26379/mymaster",
        "rediss+cluster://n1:7000,n2:7001",
    ],
)
def test_a_certificate_reference_becomes_the_ca_of_any_tls_url(ca_file: Path, url: str) -> None:
    switches = parse_switches({"rateLimit": {"backend": {"redis": {"url": url, "tls": _CERT}}}})
    assert switches.redis_url is not None
    query = parse_qs(urlsplit(switches.redis_url).query)
    assert query["ssl_ca_certs"] == [str(ca_file)]
    target = parse_redis_url(switches.redis_url)
    assert target.tls and target.ssl_ca_certs == str(ca_file)


@pytest.mark.parametrize(
    "url", ["redis://redis.mesh:6379/0", "redis+sentinel://s1:26379/m", "redis+cluster://n1:7000"]
)
def test_a_certificate_with_a_plaintext_url_is_refused(ca_file: Path, url: str) -> None:
    with pytest.raises(ConfigError, match="needs a TLS URL"):
        parse_switches({"rateLimit": {"backend": {"redis": {"url": url, "tls": _CERT}}}})
