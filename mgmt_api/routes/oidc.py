"""OIDC login endpoints (docs/identity.md): configuration, login, callback, platform token.

All four are public (no credentials): they are how a caller gets credentials.

* ``GET /v2/oidc/configuration``: what a client needs to start a login.
* ``GET /v2/oidc[/{name}]/login?redirectUri=&codeChallenge=&codeChallengeMethod=S256``:
  a 302 to the provider, with ``state``, ``nonce`` and PKCE, and the cookie
  that binds the login to this browser. A ``redirectUri`` needs the
  client's own PKCE challenge (RFC 8252).
* ``GET /v2/oidc[/{name}]/callback``: completes the login. On success with
  a ``redirectUri`` it redirects there with a one-time ``code`` appended,
  never the session token (the loopback contract of ``meshctl login``,
  docs/meshctl.md); without one it answers the token as JSON. A failure of
  a login that is genuinely this browser's goes back to ``redirectUri`` as
  ``error``/``errorDescription``, or is shown as a static HTML page; a
  forged, replayed or foreign ``state`` always gets the generic page.
* ``POST /v2/oidc[/{name}]/token``: the platform token endpoint.
  ``grant_type=authorization_code`` redeems a login code with the client's
  ``code_verifier``; ``grant_type`` token exchange (RFC 8693) trades a
  provider access token (the headless login) or the provider ID token of a
  device-code login (``subject_token_type`` ``id_token``).

Without an ``identityProvider`` section every endpoint but the
configuration answers FAILED_PRECONDITION (400) saying so.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated, Any
from urllib.parse import parse_qsl, urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.routing import APIRoute

from mgmt_api.errors import ApiError, Code
from mgmt_api.identity.error_page import CONTENT_SECURITY_POLICY, render_error_page
from mgmt_api.identity.errors import IdentityError, ProviderError, TokenExchangeRefusedError
from mgmt_api.identity.login_code import AUTHORIZATION_CODE_GRANT
from mgmt_api.identity.login_state import DEFAULT_LOGIN_TTL_S, TooManyPendingLoginsError
from mgmt_api.identity.oidc import (
    CallbackParams,
    OidcLogin,
    ProviderLoginError,
    VerifiedIdentity,
)
from mgmt_api.identity.runtime import IdentityRuntime, provider_token_id
from mgmt_api.identity.service import IdentityService
from mgmt_api.identity.token_exchange import (
    ID_TOKEN_TYPE,
    TokenBody,
    TokenExchanger,
    TokenExchangeRequestError,
    parse_token_exchange_request,
    token_exchange_response,
)
from mgmt_api.routes.deps import Name

log = logging.getLogger(__name__)

router = APIRouter(tags=["OIDC"])

# Served without credentials (the OpenAPI document marks them so).
PUBLIC_OPERATIONS = frozenset(
    {
        "GetOidcConfiguration",
        "StartOidcLogin",
        "StartNamedOidcLogin",
        "CompleteOidcLogin",
        "CompleteNamedOidcLogin",
        "ExchangeOidcToken",
        "ExchangeNamedOidcToken",
    }
)

COOKIE = "meshplane_login"


def is_public(path: str) -> bool:
    """Whether ``path`` is one of the public operations' (served without credentials)."""
    return any(pattern.match(path) for pattern in _PUBLIC_PATHS)


def runtime(request: Request) -> IdentityRuntime:
    rt: IdentityRuntime = request.app.state.identity
    return rt


def _service(request: Request) -> tuple[IdentityRuntime, IdentityService]:
    rt = runtime(request)
    if rt.service is None or not rt.service.config.oidc:
        raise ApiError(
            Code.FAILED_PRECONDITION,
            "OIDC login is not configured on this management plane (the install config has "
            "no spec.identityProvider.oidc); log in with a local user instead",
            metadata={"reason": "oidc_disabled"},
        )
    return rt, rt.service


def _login(service: IdentityService, name: str | None) -> OidcLogin:
    login = service.login(name)
    if login is None:
        raise ApiError(
            Code.NOT_FOUND, f"no OIDC configuration named {name!r}", metadata={"name": name or ""}
        )
    return login


def identity_error(exc: IdentityError) -> ApiError:
    """The API error of an identity failure; ``reason`` goes into the details."""
    if isinstance(exc, ProviderError):
        code = Code.UNAVAILABLE
    elif isinstance(exc, TokenExchangeRefusedError) and exc.reason == "client_not_allowed":
        code = Code.PERMISSION_DENIED
    else:
        code = Code.UNAUTHENTICATED
    return ApiError(code, exc.message, metadata={"reason": exc.reason})


@router.get("/v2/oidc/configuration", operation_id="GetOidcConfiguration")
async def oidc_configuration(request: Request) -> dict[str, Any]:
    """Public: issuer, client ids, and whether device-code and token exchange are on."""
    service = runtime(request).service
    if service is None:
        return {"enabled": False}
    # A plain dict: the OpenAPI documents this body as a free-form object.
    return dict(await service.configuration())


# ---- authorization-code login ----------------------------------------------------------------


async def _begin(
    request: Request,
    name: str | None,
    redirect_uri: str | None,
    code_challenge: str | None,
    code_challenge_method: str | None,
) -> Response:
    _, service = _service(request)
    login = _login(service, name)
    try:
        start = await login.begin(
            return_to=redirect_uri,
            code_challenge=code_challenge,
            code_challenge_method=code_challenge_method,
        )
    except ProviderError as exc:
        raise identity_error(exc) from None
    except IdentityError as exc:  # invalid_redirect_uri, invalid_code_challenge, ...
        field = "redirectUri" if exc.reason == "invalid_redirect_uri" else "codeChallenge"
        raise ApiError(
            Code.INVALID_ARGUMENT, exc.message, field=field, metadata={"reason": exc.reason}
        ) from None
    except TooManyPendingLoginsError as exc:
        raise ApiError(
            Code.RESOURCE_EXHAUSTED,
            str(exc),
            metadata={"reason": "too_many_pending_logins"},
            headers={"Retry-After": "60"},
        ) from None
    response = RedirectResponse(start.authorization_url, status_code=302)
    # Path and Secure come from the configured public callback URL, not from this
    # request: behind a proxy that serves the API under /iam and terminates TLS,
    # the request says http and /v2/oidc, but the browser will call back on
    # https://.../iam/v2/oidc/callback.
    response.set_cookie(
        COOKIE,
        start.browser_binding,
        max_age=int(DEFAULT_LOGIN_TTL_S),
        path=login.config.cookie_path,
        httponly=True,
        samesite="lax",
        secure=login.config.cookie_secure,
    )
    response.headers["Cache-Control"] = "no-store"
    return response


RedirectUri = Annotated[str | None, Query(alias="redirectUri", max_length=2048)]
CodeChallenge = Annotated[str | None, Query(alias="codeChallenge", max_length=128)]
CodeChallengeMethod = Annotated[str | None, Query(alias="codeChallengeMethod", max_length=16)]


@router.get("/v2/oidc/login", operation_id="StartOidcLogin", status_code=302)
async def oidc_login(
    request: Request,
    redirect_uri: RedirectUri = None,
    name: Annotated[str | None, Query(max_length=63)] = None,
    code_challenge: CodeChallenge = None,
    code_challenge_method: CodeChallengeMethod = None,
) -> Response:
    """Public: start the authorization-code flow (the default or the ``name`` configuration).

    With ``redirectUri``, ``codeChallenge`` (the client's PKCE S256 challenge) and
    ``codeChallengeMethod=S256`` are required: the redirect carries a one-time code
    that the client redeems with its verifier at ``POST /v2/oidc/token``."""
    return await _begin(request, name, redirect_uri, code_challenge, code_challenge_method)


@router.get("/v2/oidc/{name}/login", operation_id="StartNamedOidcLogin", status_code=302)
async def oidc_named_login(
    request: Request,
    name: Name,
    redirect_uri: RedirectUri = None,
    code_challenge: CodeChallenge = None,
    code_challenge_method: CodeChallengeMethod = None,
) -> Response:
    """Public: start the authorization-code flow of the ``name`` configuration."""
    return await _begin(request, name, redirect_uri, code_challenge, code_challenge_method)


def _with_query(url: str, values: dict[str, str]) -> str:
    return url + ("&" if "?" in url else "?") + urlencode(values)


def _error_page(status: int, error: str, description: str | None, uri: str | None) -> Response:
    response = HTMLResponse(render_error_page(error, description, uri), status_code=status)
    response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    response.headers["Cache-Control"] = "no-store"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


def _failed(exc: IdentityError, login: OidcLogin) -> Response:
    """A failed callback: back to the client's ``redirectUri`` when the login was this
    browser's, else a page. The provider's own text is shown only in the first case."""
    status = 503 if isinstance(exc, ProviderError) else 400
    if isinstance(exc, ProviderLoginError):
        error, description, uri = exc.error, exc.description, exc.uri
    else:
        error, description, uri = exc.reason, exc.message, None
    if exc.return_to is not None:
        values = {"error": error, "errorDescription": description or ""}
        if uri:
            values["errorUri"] = uri
        response: Response = RedirectResponse(_with_query(exc.return_to, values), status_code=302)
        response.headers["Cache-Control"] = "no-store"
    elif isinstance(exc, ProviderLoginError):
        response = _error_page(status, error, description, uri)
    else:
        response = _error_page(status, "login_failed", exc.message, None)
    _clear_cookie(response, login)
    return response


def _clear_cookie(response: Response, login: OidcLogin) -> None:
    response.delete_cookie(
        COOKIE,
        path=login.config.cookie_path,
        httponly=True,
        samesite="lax",
        secure=login.config.cookie_secure,
    )


async def _complete(request: Request, name: str | None) -> Response:
    rt, service = _service(request)
    login = _login(service, name or request.query_params.get("name") or None)

    async def find_user(identity: VerifiedIdentity) -> str | None:
        return await rt.user_for_identity(identity, login.config)

    try:
        result = await login.complete(
            CallbackParams.from_query(request.query_params),
            browser_binding=request.cookies.get(COOKIE),
            find_user=find_user,
        )
    except IdentityError as exc:
        log.info("oidc login failed", extra={"reason": exc.reason, "config": login.config.name})
        return _failed(exc, login)
    log.info("oidc login", extra={"subject": result.user, "config": login.config.name})
    response: Response
    if result.return_to is not None:
        # RFC 8252: the client behind return_to gets a one-time code, redeemable only
        # with its PKCE verifier; the session token never appears in a URL.
        code = await asyncio.to_thread(rt.issue_login_code, result)
        response = RedirectResponse(_with_query(result.return_to, {"code": code}), status_code=302)
    else:
        issued = await asyncio.to_thread(rt.mint, result.user)
        response = JSONResponse(
            {
                "accessToken": issued.access_token,
                "tokenType": "Bearer",
                "expiresIn": issued.expires_in,
                "subject": result.user,
            }
        )
    response.headers["Cache-Control"] = "no-store"
    response.headers["Referrer-Policy"] = "no-referrer"
    _clear_cookie(response, login)
    return response


@router.get("/v2/oidc/callback", operation_id="CompleteOidcLogin")
async def oidc_callback(request: Request) -> Response:
    """Public: the provider's redirect back (``code`` or ``error``, and ``state``)."""
    return await _complete(request, None)


@router.get("/v2/oidc/{name}/callback", operation_id="CompleteNamedOidcLogin")
async def oidc_named_callback(request: Request, name: Name) -> Response:
    """Public: the provider's redirect back for the ``name`` configuration."""
    return await _complete(request, name)


# ---- platform token (RFC 8693) ---------------------------------------------------------------


async def _form(request: Request) -> dict[str, str]:
    """The ``application/x-www-form-urlencoded`` body; a repeated parameter is refused
    (RFC 6749 3.2: request parameters must not be included more than once)."""
    pairs = parse_qsl((await request.body()).decode("utf-8", "replace"), keep_blank_values=True)
    form: dict[str, str] = {}
    for key, value in pairs:
        if key in form:
            raise ApiError(Code.INVALID_ARGUMENT, f"invalid_request: {key} is repeated", field=key)
        form[key] = value
    return form


async def _token(request: Request, name: str | None) -> TokenBody:
    rt, service = _service(request)
    login = _login(service, name)
    exchanger: TokenExchanger[Any] | None = service.exchanger(name)
    assert exchanger is not None  # same configuration as ``login``
    config = login.config
    form = await _form(request)
    try:
        if form.get("grant_type") == AUTHORIZATION_CODE_GRANT:
            # The loopback login's second half (RFC 8252): code + the client's verifier.
            issued = await asyncio.to_thread(rt.redeem_login_code, form, config)
            return {
                "access_token": issued.access_token,
                "token_type": "Bearer",
                "expires_in": issued.expires_in,
            }
        if form.get("subject_token_type") == ID_TOKEN_TYPE:
            # The device-code login: the provider's ID token for deviceCodeAuth.clientId.
            token = parse_token_exchange_request(form, frozenset({ID_TOKEN_TYPE})).subject_token
            identity = await login.verify_device_login(token)
            user = await rt.user_for_identity(identity, config, form.get("organization") or None)
            if user is None:
                raise TokenExchangeRefusedError(
                    "there is no user for this account; ask an administrator, or wait for "
                    "the next directory sync",
                    reason="unknown_user",
                )
            exp = identity.claims.get("exp")
            await asyncio.to_thread(
                rt.use_provider_token,
                provider_token_id(identity.claims),
                float(exp) if isinstance(exp, int | float) else rt.clock(),
            )
            body = token_exchange_response(await asyncio.to_thread(rt.mint, user))
        else:

            async def find_user(user_id: str) -> str | None:
                return await rt.user_with_id(user_id, config)

            body = await exchanger.exchange(form, find_user=find_user, mint=rt.mint_exchanged)
    except TokenExchangeRequestError as exc:
        raise ApiError(
            Code.INVALID_ARGUMENT, f"{exc.error}: {exc.message}", metadata={"reason": exc.error}
        ) from None
    except IdentityError as exc:
        log.info("platform token refused", extra={"reason": exc.reason})
        raise identity_error(exc) from None
    return body


@router.post("/v2/oidc/token", operation_id="ExchangeOidcToken")
async def oidc_token(request: Request) -> JSONResponse:
    """Public: the platform token endpoint (form-encoded).

    ``grant_type=authorization_code`` with ``code``, ``code_verifier`` (and
    optionally ``redirect_uri``): redeems the one-time code of a loopback
    login. ``grant_type=urn:ietf:params:oauth:grant-type:token-exchange``
    (RFC 8693): a provider access token, or a device login's ID token,
    becomes a temporary platform token."""
    return JSONResponse(await _token(request, None), headers={"Cache-Control": "no-store"})


@router.post("/v2/oidc/{name}/token", operation_id="ExchangeNamedOidcToken")
async def oidc_named_token(request: Request, name: Name) -> JSONResponse:
    """Public: RFC 8693 for the ``name`` configuration."""
    return JSONResponse(await _token(request, name), headers={"Cache-Control": "no-store"})


_PUBLIC_PATHS = tuple(
    route.path_regex
    for route in router.routes
    if isinstance(route, APIRoute) and route.operation_id in PUBLIC_OPERATIONS
)
