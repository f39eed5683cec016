"""The four ways to log in, each ending in a platform bearer token stored in the profile.

* Basic (local users): ``POST /v2/auth/token`` with Basic credentials. The
  password is read from stdin or a hidden prompt, sent once, never stored.
* Browser (default, RFC 8252): a loopback listener, then the management
  plane's ``/v2/oidc/login?redirectUri=http://127.0.0.1:PORT/callback?state=...``
  with meshctl's own PKCE ``codeChallenge``; after the provider login the
  management plane redirects back to the listener with a one-time ``code``,
  which meshctl redeems with its verifier at ``POST /v2/oidc/token`` (see
  ``docs/meshctl.md`` for the exact contract).
* Device code (RFC 8628) against the identity provider named by
  ``GET /v2/oidc/configuration``, then the provider's ID token is exchanged
  at the management plane's token endpoint.
* Token exchange (RFC 8693): a provider access token is exchanged directly.

Every OIDC mode first reads the public ``/v2/oidc/configuration`` so a
management plane without OIDC gives one clear sentence instead of a 404.
"""

from __future__ import annotations

import sys
import time
import webbrowser
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode, urljoin

from meshctl.client import USER_AGENT, ApiClient, require_server, verify_setting
from meshctl.config import Credentials, Profile
from meshctl.errors import ApiFailure, Exit, MeshctlError
from meshctl.oauth import (
    ACCESS_TOKEN_TYPE,
    ID_TOKEN_TYPE,
    LoopbackReceiver,
    Pkce,
    PlatformToken,
    exchange_at_platform,
    parse_platform_token,
    poll_for_tokens,
    redeem_login_code,
    start_device_authorization,
)
from meshctl.transport import Transport, basic_auth

DEVICE_SCOPES = ["openid", "email", "profile"]


def _credentials(method: str, token: PlatformToken, subject: str | None = None) -> Credentials:
    expires = (
        datetime.now(UTC) + timedelta(seconds=token.expires_in)
        if token.expires_in is not None
        else None
    )
    return Credentials(method, token.access_token, subject, expires)


def _http(profile: Profile) -> Transport:
    return Transport(
        timeout=30.0,
        verify=verify_setting(profile),
        headers={"User-Agent": USER_AGENT, "Accept": "application/json"},
    )


def login_basic(profile: Profile, username: str, password: str, *, verbose: bool) -> Credentials:
    """Exchange Basic credentials for a session token; the password goes no further."""
    with ApiClient(profile, verbose=verbose) as client:
        try:
            body = client.request(
                "POST", "/v2/auth/token", headers={"Authorization": basic_auth(username, password)}
            )
        except ApiFailure as exc:
            if exc.code_name == "UNAUTHENTICATED":
                raise exc.with_hint(
                    "check the user name and password (organization users log in as org/name)"
                ) from None
            raise
    token = parse_platform_token(body)
    subject = body.get("subject") if isinstance(body, dict) else None
    return _credentials("basic", token, subject if isinstance(subject, str) else None)


def oidc_configuration(profile: Profile, name: str | None, *, verbose: bool) -> dict[str, Any]:
    """The public OIDC configuration to use, or a clear refusal when OIDC is off."""
    with ApiClient(profile, verbose=verbose) as client:
        body = client.get("/v2/oidc/configuration")
    if not isinstance(body, dict) or body.get("enabled") is not True:
        raise MeshctlError(
            "OIDC login is not configured on this management plane (GET /v2/oidc/configuration "
            "says enabled: false); ask an administrator, or log in as a local user with "
            "meshctl login --username NAME --password-stdin",
            Exit.AUTH,
        )
    if name is None:
        return body
    for entry in body.get("configurations") or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry
    raise MeshctlError(f"the management plane has no OIDC configuration named {name!r}", Exit.USAGE)


def platform_token_url(profile: Profile, conf: dict[str, Any]) -> str:
    """Where meshctl trades provider tokens (RFC 8693) for a platform token.

    The server may name it (``platformTokenUrl``); otherwise it is
    ``/v2/oidc/token``, or ``/v2/oidc/{name}/token`` for a named
    configuration other than the default (the layout of ``loginUrl``).
    """
    base = require_server(profile) + "/"
    explicit = conf.get("platformTokenUrl")
    if isinstance(explicit, str) and explicit:
        return urljoin(base, explicit)
    login_url = conf.get("loginUrl")
    if isinstance(login_url, str) and login_url.endswith("/login"):
        return urljoin(base, login_url.removesuffix("/login") + "/token")
    return urljoin(base, "/v2/oidc/token")


def login_token_exchange(
    profile: Profile, access_token: str, oidc_name: str | None, *, verbose: bool
) -> Credentials:
    """Headless login: the provider access token is exchanged for a platform token."""
    conf = oidc_configuration(profile, oidc_name, verbose=verbose)
    if conf.get("tokenExchangeSupported") is False:
        raise MeshctlError(
            "token exchange is not enabled on this management plane "
            "(offlineAccessConfig.tokenExchange.clientId is not configured)",
            Exit.AUTH,
        )
    token = exchange_at_platform(
        _http(profile), platform_token_url(profile, conf), access_token, ACCESS_TOKEN_TYPE
    )
    return _credentials("token-exchange", token)


def login_device(
    profile: Profile,
    choose_scope: Callable[[], tuple[str, str]],
    oidc_name: str | None,
    *,
    verbose: bool,
    say: Callable[[str], None],
    sleep: Callable[[float], None] | None = None,
) -> Credentials:
    """RFC 8628 at the provider, then the ID token is exchanged at the management plane.

    ``choose_scope`` returns the organization and tenant (asking the user
    if needed); it is called only once the management plane has said that
    device login is available, so nobody types them in vain. The
    organization is sent along so the management plane maps the provider
    identity to the user record of that organization; the tenant is not a
    login matter (users belong to organizations), it only becomes the
    profile's default ``--tenant`` (the caller saves both).
    """
    conf = oidc_configuration(profile, oidc_name, verbose=verbose)
    device_endpoint = conf.get("deviceAuthorizationEndpoint")
    token_endpoint = conf.get("tokenEndpoint")
    client_id = conf.get("deviceCodeClientId")
    if conf.get("deviceCodeSupported") is False or not isinstance(client_id, str):
        raise MeshctlError(
            "device-code login is not enabled on this management plane "
            "(offlineAccessConfig.deviceCodeAuth.clientId is not configured)",
            Exit.AUTH,
        )
    if not isinstance(device_endpoint, str) or not isinstance(token_endpoint, str):
        raise MeshctlError(
            "the management plane cannot reach its identity provider right now (its OIDC "
            "configuration lacks the device and token endpoints); retry later",
            Exit.UNREACHABLE,
        )
    organization, _tenant = choose_scope()
    http = _http(profile)
    authorization = start_device_authorization(http, device_endpoint, client_id, DEVICE_SCOPES)
    say(
        f"To sign in, open {authorization.verification_uri} and enter the code "
        f"{authorization.user_code}"
    )
    if authorization.verification_uri_complete:
        say(f"(or open {authorization.verification_uri_complete})")
    say(f"Waiting for the sign-in (the code expires in {int(authorization.expires_in)} s)...")
    tokens = poll_for_tokens(
        http, token_endpoint, client_id, authorization, sleep=sleep or time.sleep
    )
    if tokens.id_token is None:
        raise MeshctlError(
            "the identity provider returned no ID token (is the openid scope allowed for "
            "the device client?)",
            Exit.AUTH,
        )
    token = exchange_at_platform(
        http,
        platform_token_url(profile, conf),
        tokens.id_token,
        ID_TOKEN_TYPE,
        {"organization": organization},
    )
    return _credentials("device-code", token)


def login_browser(
    profile: Profile,
    oidc_name: str | None,
    *,
    verbose: bool,
    open_browser: bool,
    timeout: float,
    port: int,
    say: Callable[[str], None],
) -> Credentials:
    """Authorization-code login in the browser with a loopback redirect (RFC 8252).

    The management plane sends a one-time code, not the token, to the
    loopback listener; only this process knows the PKCE verifier that
    redeems it, so another local process that catches the redirect gets
    nothing it can use.
    """
    conf = oidc_configuration(profile, oidc_name, verbose=verbose)
    login_path = conf.get("loginUrl") if isinstance(conf.get("loginUrl"), str) else "/v2/oidc/login"
    assert isinstance(login_path, str)
    pkce = Pkce.new()
    with LoopbackReceiver(port) as receiver:
        redirect_uri = receiver.redirect_uri
        url = (
            urljoin(require_server(profile) + "/", login_path)
            + "?"
            + urlencode(
                {
                    "redirectUri": redirect_uri,
                    "codeChallenge": pkce.challenge,
                    "codeChallengeMethod": "S256",
                }
            )
        )
        say(f"Opening the login page in your browser. If it does not open, visit:\n  {url}")
        if open_browser:
            webbrowser.open(url)
        params = receiver.wait(timeout)
    if "error" in params:
        description = params.get("errorDescription") or params.get("error_description") or ""
        raise MeshctlError(f"login failed ({params['error']}): {description}", Exit.AUTH)
    code = params.get("code")
    if not code:
        raise MeshctlError(
            "the management plane redirected back without a login code (it may be too old "
            "for this meshctl: it must support codeChallenge on /v2/oidc/login)",
            Exit.AUTH,
        )
    token = redeem_login_code(
        _http(profile), platform_token_url(profile, conf), code, pkce.verifier, redirect_uri
    )
    return _credentials("browser", token)


def read_secret_from_stdin(what: str) -> str:
    """One line from stdin without its newline; refuse an empty value."""
    value = sys.stdin.readline().rstrip("\r\n")
    if not value:
        raise MeshctlError(f"no {what} on stdin", Exit.USAGE)
    return value
