"""Pure decision-engine tests with an injected clock (no sockets)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from extauthz.config import (
    ExtAuthzConfig,
    JwksUriConfig,
    JwtConfig,
    PolicyConfig,
    load_config,
)
from extauthz.jwt_policy import CheckAttributes, Engine
from extauthz.keys import KeySet, hmac_key
from extauthz.reasons import Reason

from .jwtkit import HS_SECRET, OTHER_SECRET, claims, make_token
from .policies import write_policies

NOW = 1_800_000_000.0
TSB_TOKEN = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9."
    "eyJwYXRoIjoiTDJobFlXUmxjbk09IiwibmJmIjoxNTAwMDAwMDAwLCJleHAiOjE5MDAwMDAwMDB9."
    "9yl8LcZdq-5UpNLm0Hn0nnoBHXXAnK4e8RSl9vn6l98"
)


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Engine:
    monkeypatch.setenv("EXTAUTHZ_TEST_SECRET", HS_SECRET.decode())
    return Engine(load_config(write_policies(tmp_path)))


def decide(
    engine: Engine, token: str | None, path: str, policy: str | None = None, now: float = NOW
) -> Reason:
    auth = (f"Bearer {token}",) if token is not None else ()
    return engine.decide(CheckAttributes(path, auth, policy), now).reason


@pytest.mark.parametrize(
    ("path", "now", "expected"),
    [
        ("/headers", 1_700_000_000, Reason.OK),
        ("/headers?show_env=1", 1_700_000_000, Reason.OK),
        ("/get", 1_700_000_000, Reason.PATH_NOT_ALLOWED),
        ("/headers", 1_500_000_000, Reason.OK),  # nbf == now allows
        ("/headers", 1_499_999_999, Reason.NOT_YET_VALID),
        ("/headers", 1_900_000_000, Reason.EXPIRED),  # exp == now denies
        ("/headers", 2_000_000_000, Reason.EXPIRED),  # after 2030-03-17
    ],
)
def test_tsb_demo_token(engine: Engine, path: str, now: float, expected: Reason) -> None:
    assert decide(engine, TSB_TOKEN, path, "tsb", now) is expected


def test_time_is_rechecked_on_cache_hits(engine: Engine) -> None:
    token = make_token(claims(NOW))
    assert decide(engine, token, "/headers", now=NOW) is Reason.OK
    assert len(engine.policies["hs"].cache) == 1
    assert decide(engine, token, "/headers", now=NOW + 3600) is Reason.EXPIRED
    assert decide(engine, token, "/headers", now=NOW - 3601) is Reason.NOT_YET_VALID
    # Path checks also run per request against the cached prefix.
    assert decide(engine, token, "/get", now=NOW) is Reason.PATH_NOT_ALLOWED


def test_leeway_widens_both_ends(engine: Engine) -> None:
    token = make_token(
        claims(NOW, path=None, iss="https://idp.example", aud="api", nbf=NOW, exp=NOW + 10)
    )
    assert decide(engine, token, "/x", "iss", NOW - 30) is Reason.OK
    assert decide(engine, token, "/x", "iss", NOW - 31) is Reason.NOT_YET_VALID
    assert decide(engine, token, "/x", "iss", NOW + 39) is Reason.OK
    assert decide(engine, token, "/x", "iss", NOW + 40) is Reason.EXPIRED


class RemoteKeys:
    """A JWKS source whose keys the test swaps (as an IdP rotating them would)."""

    def __init__(self, secret: bytes) -> None:
        self.keys = KeySet.of([hmac_key(secret, kid="k1")])
        self.version = 1
        self.kid_miss_wait_seconds = 0.0

    def request_refetch(self) -> None:
        return None


def remote_engine(remote: RemoteKeys) -> Engine:
    """One HS256 policy ``p`` whose keys come from ``remote``."""
    policy = PolicyConfig(
        "p", JwtConfig(frozenset({"HS256"}), (), (JwksUriConfig("http://idp/jwks"),))
    )
    return Engine(ExtAuthzConfig("p", {"p": policy}), lambda _cfg: remote)


def test_cache_is_dropped_when_keys_change() -> None:
    remote = RemoteKeys(HS_SECRET)
    engine = remote_engine(remote)
    token = make_token(claims(NOW, path=None), header={"kid": "k1"})
    assert decide(engine, token, "/") is Reason.OK
    assert len(engine.policies["p"].cache) == 1
    # The IdP drops k1: the cached verdict must not outlive the key.
    remote.keys = KeySet.of([hmac_key(OTHER_SECRET, kid="k2")])
    remote.version = 2
    assert decide(engine, token, "/") is Reason.UNKNOWN_KID
    assert len(engine.policies["p"].cache) == 0


def test_claim_headers_and_authorization_removal(engine: Engine) -> None:
    token = make_token(claims(NOW, sub="alice", tier=3, groups=["a"]))
    decision = engine.decide(CheckAttributes("/headers", (f"Bearer {token}",), "hdr"), NOW)
    assert decision.allowed
    assert decision.headers_to_add == (("x-jwt-sub", "alice"), ("x-jwt-tier", "3"))
    # A list claim cannot be a header: it is removed so a client copy cannot pass.
    assert decision.headers_to_remove == ("authorization", "x-jwt-groups")
    bad = make_token(claims(NOW, sub="alice\r\nx-admin: 1"))
    decision = engine.decide(CheckAttributes("/headers", (f"Bearer {bad}",), "hdr"), NOW)
    assert decision.allowed
    assert "x-jwt-sub" in decision.headers_to_remove


def test_builtin_and_unknown_policies(engine: Engine) -> None:
    assert decide(engine, None, "/x", "allow") is Reason.ALLOW_POLICY
    assert decide(engine, None, "/x", "deny") is Reason.DENY_POLICY
    assert decide(engine, None, "/x", "nope") is Reason.UNKNOWN_POLICY
    assert decide(engine, None, "/x", "") is Reason.UNKNOWN_POLICY
    assert decide(engine, None, "/x", None) is Reason.MISSING_AUTHORIZATION  # default: hs


def test_only_successes_are_cached(engine: Engine) -> None:
    forged = make_token(claims(NOW), key=OTHER_SECRET)
    for _ in range(3):
        assert decide(engine, forged, "/headers") is Reason.BAD_SIGNATURE
    assert len(engine.policies["hs"].cache) == 0


def test_a_refused_token_is_refused_again_from_its_cache(engine: Engine) -> None:
    forged = make_token(claims(NOW), key=OTHER_SECRET)
    policy = engine.policies["hs"]
    assert decide(engine, forged, "/headers") is Reason.BAD_SIGNATURE
    assert len(policy.refused) == 1
    assert len(policy.cache) == 0
    assert decide(engine, forged, "/headers") is Reason.BAD_SIGNATURE
    assert decide(engine, "not.a.jwt!", "/headers") is Reason.MALFORMED_TOKEN
    assert len(policy.refused) == 2
    # Refusals that depend on the clock or the path are never kept.
    valid = make_token(claims(NOW))
    assert decide(engine, valid, "/headers", now=NOW + 3600) is Reason.EXPIRED
    assert decide(engine, valid, "/get") is Reason.PATH_NOT_ALLOWED
    assert len(policy.refused) == 2
    assert decide(engine, valid, "/headers") is Reason.OK


def test_refusals_are_dropped_when_keys_change_and_kid_misses_never_kept() -> None:
    """A token refused under one key set is verified again under the next:
    a cached refusal can never outlive the keys it was made with."""

    remote = RemoteKeys(OTHER_SECRET)
    engine = remote_engine(remote)
    token = make_token(claims(NOW, path=None), header={"kid": "k1"})
    assert decide(engine, token, "/") is Reason.BAD_SIGNATURE
    assert len(engine.policies["p"].refused) == 1
    remote.keys = KeySet.of([hmac_key(HS_SECRET, kid="k1")])  # the key it was signed with
    remote.version = 2
    assert decide(engine, token, "/") is Reason.OK
    unknown = make_token(claims(NOW, path=None), header={"kid": "k9"})
    assert decide(engine, unknown, "/") is Reason.UNKNOWN_KID
    assert len(engine.policies["p"].refused) == 0


def test_no_refusal_cache_when_the_token_cache_is_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXTAUTHZ_TEST_SECRET", HS_SECRET.decode())
    config = load_config(write_policies(tmp_path))
    engine = Engine(replace(config, token_cache_size=0))
    forged = make_token(claims(NOW), key=OTHER_SECRET)
    assert decide(engine, forged, "/headers") is Reason.BAD_SIGNATURE
    assert len(engine.policies["hs"].refused) == 0
