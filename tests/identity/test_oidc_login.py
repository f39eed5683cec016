"""Browser-less authorization-code logins against the real test OIDC provider."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from mgmt_api.identity.config import IdentityProviderConfig
from mgmt_api.identity.discovery import DiscoveryCache
from mgmt_api.identity.error_page import render_error_page
from mgmt_api.identity.errors import InvalidLoginError, ProviderError
from mgmt_api.identity.login_state import InMemoryLoginStateStore
from mgmt_api.identity.oidc import CallbackParams, OidcLogin, ProviderLoginError, VerifiedIdentity
from mgmt_api.identity.pkce import code_challenge_s256, new_code_verifier
from tests.identity.browser import follow_until
from tests.identity.conftest import CALLBACK

USERS = {"alice": {"name": "alice", "email": "alice@example.test"}}
CHALLENGE = code_challenge_s256(new_code_verifier())


async def find_user(identity: VerifiedIdentity) -> dict[str, str] | None:
    return USERS.get(identity.subject)


def make_login(config: IdentityProviderConfig, http: httpx.AsyncClient) -> OidcLogin:
    oidc = config.oidc_named("corp")
    assert oidc is not None
    return OidcLogin(
        oidc, http=http, discovery=DiscoveryCache(http), states=InMemoryLoginStateStore()
    )


async def provider_callback(
    login: OidcLogin, *, login_hint: str | None = None, return_to: str | None = None
) -> tuple[CallbackParams, str]:
    """Start a login and walk the provider's pages; returns the callback params and cookie."""
    start = await login.begin(
        return_to,
        code_challenge=CHALLENGE if return_to else None,
        code_challenge_method="S256" if return_to else None,
    )
    url = start.authorization_url + (f"&login_hint={login_hint}" if login_hint else "")
    async with httpx.AsyncClient(timeout=10.0) as browser:
        callback_url = await follow_until(browser, url, CALLBACK)
    query = {k: v[0] for k, v in parse_qs(urlsplit(callback_url).query).items()}
    return CallbackParams.from_query(query), start.browser_binding


async def test_full_login_maps_the_id_token_to_the_user(
    idp_config: IdentityProviderConfig, http: httpx.AsyncClient
) -> None:
    login = make_login(idp_config, http)
    start = await login.begin(
        "/ui/clusters", code_challenge=CHALLENGE, code_challenge_method="S256"
    )
    query = parse_qs(urlsplit(start.authorization_url).query)
    assert query["code_challenge_method"] == ["S256"]
    assert query["scope"] == ["openid email profile offline_access"]
    assert query["nonce"][0] and query["state"][0] == start.state

    callback, cookie = await provider_callback(login, return_to="/ui/clusters")
    result = await login.complete(callback, browser_binding=cookie, find_user=find_user)

    assert result.user == USERS["alice"]
    assert result.identity.subject == "alice"
    assert result.identity.email == "alice@example.test"
    assert result.identity.email_verified is True
    assert result.return_to == "/ui/clusters"
    assert result.client_challenge == CHALLENGE  # for the one-time code of that client
    assert result.config_name == "corp"


async def test_replayed_state_is_refused(
    idp_config: IdentityProviderConfig, http: httpx.AsyncClient
) -> None:
    login = make_login(idp_config, http)
    callback, cookie = await provider_callback(login)
    await login.complete(callback, browser_binding=cookie, find_user=find_user)
    with pytest.raises(InvalidLoginError) as refused:
        await login.complete(callback, browser_binding=cookie, find_user=find_user)
    assert refused.value.reason == "unknown_state"


async def test_forged_state_is_refused_and_the_real_one_still_works(
    idp_config: IdentityProviderConfig, http: httpx.AsyncClient
) -> None:
    login = make_login(idp_config, http)
    callback, cookie = await provider_callback(login)
    forged = CallbackParams(state="forged-" + (callback.state or ""), code=callback.code)
    with pytest.raises(InvalidLoginError) as refused:
        await login.complete(forged, browser_binding=cookie, find_user=find_user)
    assert refused.value.reason == "unknown_state"
    result = await login.complete(callback, browser_binding=cookie, find_user=find_user)
    assert result.identity.subject == "alice"


async def test_missing_state_is_refused(
    idp_config: IdentityProviderConfig, http: httpx.AsyncClient
) -> None:
    login = make_login(idp_config, http)
    with pytest.raises(InvalidLoginError) as refused:
        await login.complete(
            CallbackParams(state=None, code="x"), browser_binding=None, find_user=find_user
        )
    assert refused.value.reason == "missing_state"


async def test_state_from_another_browser_is_refused_and_burnt(
    idp_config: IdentityProviderConfig, http: httpx.AsyncClient
) -> None:
    login = make_login(idp_config, http)
    callback, cookie = await provider_callback(login)
    with pytest.raises(InvalidLoginError) as refused:
        await login.complete(callback, browser_binding="another-browser", find_user=find_user)
    assert refused.value.reason == "state_not_bound"
    with pytest.raises(InvalidLoginError):
        await login.complete(callback, browser_binding=cookie, find_user=find_user)


async def test_a_provider_error_callback_yields_an_escaped_error_page(
    idp_config: IdentityProviderConfig, http: httpx.AsyncClient
) -> None:
    login = make_login(idp_config, http)
    callback, cookie = await provider_callback(login, login_hint="deny")
    assert callback.code is None
    with pytest.raises(ProviderLoginError) as refused:
        await login.complete(callback, browser_binding=cookie, find_user=find_user)
    error = refused.value
    assert error.error == "access_denied"
    page = render_error_page(error.error, error.description, error.uri)
    assert "access_denied" in page
    assert "denied by &lt;b&gt;test&lt;/b&gt; &amp; &quot;friends&quot;" in page
    assert "<b>test</b>" not in page


async def test_a_user_unknown_to_the_management_plane_cannot_log_in(
    idp_config: IdentityProviderConfig, http: httpx.AsyncClient
) -> None:
    login = make_login(idp_config, http)
    callback, cookie = await provider_callback(login, login_hint="bob")
    with pytest.raises(InvalidLoginError) as refused:
        await login.complete(callback, browser_binding=cookie, find_user=find_user)
    assert refused.value.reason == "unknown_user"


async def test_an_open_redirect_target_is_refused(
    idp_config: IdentityProviderConfig, http: httpx.AsyncClient
) -> None:
    login = make_login(idp_config, http)
    with pytest.raises(InvalidLoginError) as refused:
        await login.begin("https://evil.example/phish")
    assert refused.value.reason == "invalid_redirect_uri"


async def test_a_cookie_computed_from_the_state_or_a_wrong_cookie_is_refused(
    idp_config: IdentityProviderConfig, http: httpx.AsyncClient
) -> None:
    """Whoever captures the callback URL knows ``state``. The cookie used to be
    sha256("meshplane-login:" + state): that value, and any other guess, must fail."""
    login = make_login(idp_config, http)
    guesses: tuple[Callable[[str], str], ...] = (
        lambda state: hashlib.sha256(("meshplane-login:" + state).encode()).hexdigest(),
        lambda state: "a-wrong-cookie",
    )
    for cookie_of in guesses:
        callback, real_cookie = await provider_callback(login)
        assert callback.state is not None
        guessed = cookie_of(callback.state)
        assert guessed != real_cookie
        with pytest.raises(InvalidLoginError) as refused:
            await login.complete(callback, browser_binding=guessed, find_user=find_user)
        assert refused.value.reason == "state_not_bound"
        with pytest.raises(InvalidLoginError):  # burnt: the real browser cannot finish it now
            await login.complete(callback, browser_binding=real_cookie, find_user=find_user)


@pytest.mark.parametrize(
    ("return_to", "challenge", "method", "reason"),
    [
        ("http://127.0.0.1:5000/cb", None, None, "code_challenge_required"),
        ("http://127.0.0.1:5000/cb", CHALLENGE, "plain", "invalid_code_challenge"),
        ("http://127.0.0.1:5000/cb", "too-short", "S256", "invalid_code_challenge"),
        (None, CHALLENGE, "S256", "invalid_request"),
        ("http://localhost:5000/cb", CHALLENGE, "S256", "invalid_redirect_uri"),
    ],
    # Stable ids (the challenge is random): the same on every collection.
    ids=["no challenge", "plain method", "short challenge", "no target", "foreign target"],
)
async def test_a_redirect_target_needs_the_clients_pkce_challenge(
    idp_config: IdentityProviderConfig,
    http: httpx.AsyncClient,
    return_to: str | None,
    challenge: str | None,
    method: str | None,
    reason: str,
) -> None:
    login = make_login(idp_config, http)
    with pytest.raises(InvalidLoginError) as refused:
        await login.begin(return_to, code_challenge=challenge, code_challenge_method=method)
    assert refused.value.reason == reason


async def test_an_unreadable_client_secret_is_a_clear_provider_error_not_a_crash(
    idp_config: IdentityProviderConfig, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    """The state is consumed before the code exchange; a secret file gone missing must
    still end in an identity error the callback can show (503), not an HTTP 500."""
    login = make_login(idp_config, http)
    callback, cookie = await provider_callback(login)
    (tmp_path / "client-secret").unlink()  # the file oidc_section wrote
    with pytest.raises(ProviderError) as failed:
        await login.complete(callback, browser_binding=cookie, find_user=find_user)
    assert failed.value.reason == "client_secret_unavailable"
    assert "client-secret" in failed.value.message and "web-secret" not in failed.value.message
