"""Pure pieces of the login: PKCE, pending-login store, ID token claims, redirects, error page."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from mgmt_api.identity.claims import check_id_token, check_time
from mgmt_api.identity.discovery import parse_metadata
from mgmt_api.identity.error_page import render_error_page, safe_link
from mgmt_api.identity.errors import InvalidTokenError, ProviderError
from mgmt_api.identity.login_state import (
    InMemoryLoginStateStore,
    LoginState,
    LoginStateStore,
    TooManyPendingLoginsError,
    binding_digest,
    new_browser_binding,
)
from mgmt_api.identity.oidc import CallbackParams
from mgmt_api.identity.pkce import code_challenge_s256, is_s256_challenge, new_code_verifier
from mgmt_api.identity.redirects import is_safe_return_to
from mgmt_api.identity.sql_store import SqlLoginStateStore
from mgmt_api.store.uow import UnitOfWork


def test_pkce_s256_matches_rfc7636_appendix_b() -> None:
    assert (
        code_challenge_s256("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk")
        == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
    )
    verifier = new_code_verifier()
    assert len(verifier) == 43 and verifier != new_code_verifier()
    with pytest.raises(ValueError):
        code_challenge_s256("short")
    assert is_s256_challenge(code_challenge_s256(verifier))
    assert not is_s256_challenge(verifier + "=") and not is_s256_challenge("x" * 42)


def login(
    state: str, now: float = 1000.0, ttl: float = 600.0, binding_hash: str = "0" * 64
) -> LoginState:
    return LoginState(
        state, "corp", "nonce", "v" * 43, "https://cb", None, now, now + ttl, binding_hash
    )


@pytest.fixture(params=["memory", "sql"])
def make_store(request: pytest.FixtureRequest) -> Any:
    """Both ``LoginStateStore`` implementations: the SQL one on the real, migrated schema."""

    def make(max_pending: int = 10_000) -> LoginStateStore:
        if request.param == "memory":
            return InMemoryLoginStateStore(max_pending=max_pending)
        engine: Engine = request.getfixturevalue("sqlite_engine")
        return SqlLoginStateStore(UnitOfWork(engine), max_pending=max_pending)

    return make


def test_login_state_is_single_use_and_expires(make_store: Any) -> None:
    store = make_store()
    store.put(login("a"))
    store.put(login("b"))
    assert store.take("a", 1001.0) is not None
    assert store.take("a", 1001.0) is None  # replay
    assert store.take("b", 1600.0) is None  # expired (and gone)
    assert store.take("never", 1001.0) is None


def test_login_state_store_is_bounded_and_purges(make_store: Any) -> None:
    """Logins are started without credentials: past the cap a new one is refused, after
    the expired ones were purged to make room (both stores, the server's SQL one too)."""
    store = make_store(max_pending=2)
    store.put(login("a", now=0, ttl=10))
    store.put(login("b", now=0, ttl=100))
    with pytest.raises(TooManyPendingLoginsError):
        store.put(login("c", now=5))
    store.put(login("d", now=20))  # "a" has expired and is purged to make room
    assert len(store) == 2
    with pytest.raises(TooManyPendingLoginsError):
        store.put(login("e", now=21))
    assert store.purge_expired(1000) == 2
    assert store.take("b", 30) is None and len(store) == 0


def test_the_login_cookie_is_random_and_only_its_digest_is_kept() -> None:
    """Finding: the cookie used to be sha256("meshplane-login:" + state), computable by
    anyone who saw the callback URL. Now it is an independent random value."""
    cookie, digest = new_browser_binding()
    other, _ = new_browser_binding()
    assert cookie != other and len(cookie) >= 43
    assert digest == binding_digest(cookie) == hashlib.sha256(cookie.encode()).hexdigest()
    state = login("abc", binding_hash=digest)
    assert state.bound_to(cookie)
    old_scheme = hashlib.sha256(b"meshplane-login:abc").hexdigest()
    assert not state.bound_to(old_scheme)
    assert not state.bound_to(digest)  # the stored digest is not the cookie
    assert not state.bound_to(None) and not state.bound_to("x") and not state.bound_to(other)


NOW = 1_700_000_000.0
GOOD: dict[str, Any] = {
    "iss": "https://idp",
    "aud": "web",
    "sub": "alice",
    "nonce": "n1",
    "iat": NOW - 5,
    "exp": NOW + 300,
}


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({}, None),
        ({"iss": "https://evil"}, "wrong_issuer"),
        ({"aud": "other"}, "wrong_audience"),
        ({"aud": ["web", "other"]}, "wrong_azp"),
        ({"aud": ["web", "other"], "azp": "web"}, None),
        ({"nonce": "n2"}, "wrong_nonce"),
        ({"nonce": None}, "wrong_nonce"),
        ({"exp": NOW - 61}, "expired"),
        ({"exp": NOW - 30}, None),  # within the 60 s leeway
        ({"exp": None}, "missing_exp"),
        ({"exp": "soon"}, "missing_exp"),
        ({"iat": NOW + 120}, "iat_in_future"),
        ({"iat": NOW + 30}, None),
        ({"iat": None}, "missing_iat"),
        ({"nbf": NOW + 120}, "not_yet_valid"),
        ({"sub": ""}, "missing_sub"),
    ],
)
def test_id_token_claims(changes: dict[str, Any], reason: str | None) -> None:
    claims = {**GOOD, **changes}
    claims = {k: v for k, v in claims.items() if v is not None}
    if reason is None:
        assert (
            check_id_token(claims, issuer="https://idp", client_id="web", nonce="n1", now=NOW)
            == "alice"
        )
    else:
        with pytest.raises(InvalidTokenError) as error:
            check_id_token(claims, issuer="https://idp", client_id="web", nonce="n1", now=NOW)
        assert error.value.reason == reason


def test_device_flow_id_tokens_have_no_nonce_to_check() -> None:
    claims = {k: v for k, v in GOOD.items() if k != "nonce"}
    assert (
        check_id_token(claims, issuer="https://idp", client_id="web", nonce=None, now=NOW)
        == "alice"
    )


def test_time_checks_respect_zero_leeway() -> None:
    with pytest.raises(InvalidTokenError):
        check_time({"exp": NOW}, now=NOW, leeway=0)
    check_time({"exp": NOW + 1}, now=NOW, leeway=0)


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("/ui/clusters?x=1", True),
        ("//evil.example/x", False),
        ("/\\evil", False),
        ("http://127.0.0.1:53682/callback", True),
        ("http://127.0.0.1/callback?state=s", True),
        ("http://[::1]:53682/callback", True),
        ("http://localhost:8000/", False),  # RFC 8252 8.3: literal loopback IPs only
        ("http://127.0.0.1.evil.example/", False),
        ("http://127.1:8000/", False),
        ("http://user@127.0.0.1:8000/", False),
        ("https://127.0.0.1:8000/", False),
        ("https://mp.example.com/ui", True),
        ("https://evil.example/ui", False),
        ("http://mp.example.com/ui", False),
        ("javascript:alert(1)", False),
        ("https://user@mp.example.com/", False),
        ("", False),
        ("/ok\r\nSet-Cookie: x", False),
    ],
)
def test_post_login_redirects(value: str, ok: bool) -> None:
    assert is_safe_return_to(value, ["https://mp.example.com"]) is ok


def test_error_page_escapes_everything_and_links_only_http() -> None:
    page = render_error_page(
        "<script>alert(1)</script>",
        'bad "thing" <img src=x onerror=alert(1)>',
        "javascript:alert(document.cookie)",
    )
    assert "<script>" not in page and "<img" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&quot;thing&quot;" in page
    assert 'href="javascript' not in page and "javascript:alert(document.cookie)" in page
    linked = render_error_page("access_denied", None, 'https://idp.example/help?a=1&b="x"')
    assert 'href="https://idp.example/help?a=1&amp;b=&quot;x&quot;"' in linked
    assert "declined the sign-in" in linked
    assert safe_link("data:text/html,x") is None and safe_link("https:///nohost") is None
    assert len(render_error_page("e", "x" * 100_000)) < 10_000


def test_callback_params_accept_spec_and_rfc_spellings() -> None:
    spec = CallbackParams.from_query(
        {"state": "s", "error": "e", "errorDescription": "d", "errorUri": "u"}
    )
    rfc = CallbackParams.from_query(
        {"state": "s", "error": "e", "error_description": "d", "error_uri": "u"}
    )
    assert spec == rfc == CallbackParams(state="s", error="e", error_description="d", error_uri="u")


DISCOVERY = {
    "issuer": "https://idp.example/tenant/v2.0",
    "authorization_endpoint": "https://idp.example/authorize",
    "token_endpoint": "https://idp.example/token",
    "jwks_uri": "https://idp.example/keys",
}


def test_discovery_issuer_must_match_the_configuration_uri() -> None:
    uri = "https://idp.example/tenant/v2.0/.well-known/openid-configuration"
    metadata = parse_metadata(DISCOVERY, uri)
    assert metadata.token_auth_method() == "client_secret_basic"
    post_only = parse_metadata(
        {**DISCOVERY, "token_endpoint_auth_methods_supported": ["client_secret_post"]}, uri
    )
    assert post_only.token_auth_method() == "client_secret_post"
    with pytest.raises(ProviderError, match="does not match"):
        parse_metadata({**DISCOVERY, "issuer": "https://evil.example"}, uri)
    with pytest.raises(ProviderError, match="S256"):
        parse_metadata({**DISCOVERY, "code_challenge_methods_supported": ["plain"]}, uri)
    with pytest.raises(ProviderError, match="token_endpoint"):
        parse_metadata({**DISCOVERY, "token_endpoint": "ftp://x"}, uri)
