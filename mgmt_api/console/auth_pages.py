"""Sign in (local users with a password, or OIDC), sign out.

* Password: the form's login and password go to ``POST /v2/auth/token`` as
  Basic credentials (so the API's failed-login throttle applies, by the
  browser's address); the session token it returns becomes the cookie.
* OIDC: ``GET /v2/oidc/login`` with ``redirectUri=/ui/login/oidc/return``
  and the console's own PKCE challenge; the provider sends the browser back
  through the API's callback, which redirects here with a one-time code,
  redeemed at ``POST /v2/oidc/token`` with the verifier (kept in an
  HttpOnly cookie scoped to ``/ui/`` for the ten minutes a login may take).
  No token ever appears in a URL.
* Sign out is a POST (with the CSRF token) that clears the cookie.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import RedirectResponse

from mgmt_api.console import session
from mgmt_api.console.api import ApiCallError
from mgmt_api.console.web import (
    ConsoleRoute,
    console_of,
    cookie,
    delete_cookie,
    origin_of,
    set_cookie,
    signed_in,
)

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)
RETURN_PATH = "/ui/login/oidc/return"
Next = Annotated[str, Query(alias="next", max_length=2048)]


async def _oidc_configurations(request: Request) -> list[dict[str, Any]]:
    c = console_of(request)
    response = await c.api.request(origin_of(request), "GET", "/v2/oidc/configuration")
    body = response.json() if response.status == 200 else None
    if not isinstance(body, dict) or not body.get("enabled"):
        return []
    return [e for e in body.get("configurations") or [] if isinstance(e, dict)]


def _login_page(
    request: Request,
    next_path: str,
    *,
    error: str = "",
    notice: str = "",
    login: str = "",
    status: int = 200,
    providers: list[dict[str, Any]] | None = None,
) -> Response:
    nonce = session.new_nonce()
    response = console_of(request).render(
        "login.html",
        status,
        request=request,
        path=request.url.path,
        user=None,
        next_path=next_path,
        nonce=nonce,
        error=error,
        notice=notice,
        login=login,
        providers=providers or [],
    )
    set_cookie(response, request, session.LOGIN_NONCE_NAME, nonce, session.LOGIN_NONCE_TTL)
    return response


@router.get("/ui/login")
async def login_form(
    request: Request,
    next_path: Next = "/ui/",
    expired: Annotated[str, Query(max_length=8)] = "",
    error: Annotated[str, Query(max_length=500)] = "",
) -> Response:
    notice = "Your session expired. Sign in again to continue where you were." if expired else ""
    providers = await _oidc_configurations(request)
    text = f"The identity provider refused the login: {error}" if error else ""
    return _login_page(
        request, session.safe_next(next_path), notice=notice, error=text, providers=providers
    )


def _signed_in_response(request: Request, token: str, ttl: int, next_path: str) -> Response:
    response = RedirectResponse(session.safe_next(next_path), status_code=303)
    set_cookie(response, request, session.SESSION_NAME, token, ttl)
    delete_cookie(response, request, session.LOGIN_NONCE_NAME)
    return response


@router.post("/ui/login")
async def login(request: Request) -> Response:
    form: dict[str, str] = request.state.form
    next_path = session.safe_next(form.get("next"))
    login_name = form.get("login", "").strip()
    providers = await _oidc_configurations(request)
    if not session.nonce_ok(
        cookie(request, session.LOGIN_NONCE_NAME), form.get(session.CSRF_FIELD)
    ):
        return _login_page(
            request,
            next_path,
            status=403,
            login=login_name,
            providers=providers,
            error="This sign-in form expired or came from another site. Sign in again.",
        )
    if not login_name or not form.get("password"):
        return _login_page(
            request,
            next_path,
            status=400,
            login=login_name,
            providers=providers,
            error="Enter your login and password.",
        )
    basic = base64.b64encode(f"{login_name}:{form['password']}".encode()).decode()
    response = await console_of(request).api.request(
        origin_of(request), "POST", "/v2/auth/token", authorization=f"Basic {basic}"
    )
    if response.status != 200:
        error = ApiCallError.from_response(response)
        if error.status == 401:
            text = "Wrong login or password. Organization users sign in as organization/login."
        elif error.status == 429:
            text = (
                f"Too many failed attempts: wait {error.retry_after or 60} seconds and try again."
            )
        else:
            text = f"Sign-in failed: {error.message}"
        return _login_page(
            request,
            next_path,
            status=error.status,
            login=login_name,
            providers=providers,
            error=text,
        )
    body = response.json()
    return _signed_in_response(request, str(body["accessToken"]), int(body["expiresIn"]), next_path)


@router.get("/ui/login/oidc")
async def oidc_start(
    request: Request,
    next_path: Next = "/ui/",
    name: Annotated[str, Query(max_length=63, pattern=r"^[a-z0-9-]*$")] = "",
) -> Response:
    verifier = secrets.token_urlsafe(48)
    challenge = (
        base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    )
    params = {
        "redirectUri": RETURN_PATH,
        "codeChallenge": challenge,
        "codeChallengeMethod": "S256",
        **({"name": name} if name else {}),
    }
    response = RedirectResponse("/v2/oidc/login?" + urlencode(params), status_code=303)
    state = json.dumps({"v": verifier, "next": session.safe_next(next_path), "name": name})
    set_cookie(
        response,
        request,
        session.OIDC_NAME,
        base64.urlsafe_b64encode(state.encode()).decode(),
        session.LOGIN_NONCE_TTL,
    )
    return response


@router.get(RETURN_PATH)
async def oidc_return(
    request: Request,
    code: Annotated[str, Query(max_length=256)] = "",
    error: Annotated[str, Query(max_length=200)] = "",
    error_description: Annotated[str, Query(alias="errorDescription", max_length=2000)] = "",
) -> Response:
    raw = cookie(request, session.OIDC_NAME) or ""
    try:
        pending = json.loads(base64.urlsafe_b64decode(raw.encode()))
        verifier, next_path, name = (
            str(pending["v"]),
            str(pending["next"]),
            str(pending.get("name") or ""),
        )
    except (ValueError, KeyError, TypeError):
        return _login_page(
            request,
            "/ui/",
            status=400,
            error="This sign-in link expired. Sign in again.",
            providers=await _oidc_configurations(request),
        )
    if error or not code:
        return _login_page(
            request,
            next_path,
            status=400,
            providers=await _oidc_configurations(request),
            error="The identity provider refused the login: "
            + (error_description or error or "no code"),
        )
    path = f"/v2/oidc/{name}/token" if name else "/v2/oidc/token"
    response = await console_of(request).api.request(
        origin_of(request),
        "POST",
        path,
        form={"grant_type": "authorization_code", "code": code, "code_verifier": verifier},
    )
    if response.status != 200:
        failure = ApiCallError.from_response(response)
        return _login_page(
            request,
            next_path,
            status=failure.status,
            providers=await _oidc_configurations(request),
            error=f"Sign-in failed: {failure.message}",
        )
    body = response.json()
    done = _signed_in_response(
        request, str(body["access_token"]), int(body["expires_in"]), next_path
    )
    delete_cookie(done, request, session.OIDC_NAME)
    return done


@router.post("/ui/logout")
async def logout(request: Request) -> Response:
    signed_in(request)
    response: Response
    if request.headers.get("hx-request"):
        response = Response(status_code=200, headers={"HX-Redirect": "/ui/login"})
    else:
        response = RedirectResponse("/ui/login", status_code=303)
    delete_cookie(response, request, session.SESSION_NAME)
    return response


@router.get("/ui/static/{name:path}")
async def static(request: Request, name: str) -> Response:
    asset = console_of(request).assets.get(name)
    if asset is None:
        return Response(status_code=404)
    return Response(
        asset.body,
        media_type=asset.content_type,
        headers={"Cache-Control": "public, max-age=31536000, immutable"},
    )
