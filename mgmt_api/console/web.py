"""The console's HTTP glue: templates, static files, the signed-in user, headers, errors.

Every console response gets the security headers (a strict CSP with no
inline script or style, no framing, no caching of pages). Every
state-changing request must carry the session's CSRF token (form field or
``X-CSRF-Token``), checked before the handler runs. Failures never show a
stack trace: an API error becomes a page that says what to fix, an expired
session sends the user to the login page (and back afterwards), and
anything unexpected is logged and shown as a plain "try again" page.
"""

from __future__ import annotations

import hashlib
import logging
import mimetypes
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, quote

import jinja2
import jwt
from fastapi import HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.routing import APIRoute

from mgmt_api.console import navigation, session
from mgmt_api.console.api import ApiCallError, InProcessApi, Origin, UserApi

log = logging.getLogger(__name__)

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
POLL_TRIGGER = "live-status"  # the id of the element whose polls must not navigate away
UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})


@dataclass(frozen=True)
class Asset:
    body: bytes
    content_type: str
    version: str


def _load_assets() -> dict[str, Asset]:
    root = resources.files("mgmt_api.console") / "static"
    out: dict[str, Asset] = {}
    for entry in [root, root / "vendor"]:
        for item in entry.iterdir():
            if item.is_file() and not item.name.endswith(".txt"):
                body = item.read_bytes()
                name = item.name if entry == root else f"vendor/{item.name}"
                kind = mimetypes.guess_type(item.name)[0] or "application/octet-stream"
                out[name] = Asset(body, kind, hashlib.sha256(body).hexdigest()[:16])
    return out


class Console:
    """What the console's routes share; built once when the app is created."""

    def __init__(self, api: InProcessApi, signing_secret: str, public_url: str | None) -> None:
        self.api = api
        self.csrf_key = session.csrf_key(signing_secret)
        self.public_url = public_url
        self.assets = _load_assets()
        self.templates = jinja2.Environment(
            loader=jinja2.PackageLoader("mgmt_api.console", "templates"),
            autoescape=True,
            undefined=jinja2.ChainableUndefined,  # API objects omit unset fields
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.templates.globals["asset"] = self.asset_url
        self.templates.globals["trail"] = navigation.trail

    def asset_url(self, name: str) -> str:
        return f"/ui/static/{name}?v={self.assets[name].version}"

    def render(self, template: str, status: int = 200, /, **context: Any) -> HTMLResponse:
        return HTMLResponse(
            self.templates.get_template(template).render(**context), status_code=status
        )


def console_of(request: Request) -> Console:
    c: Console = request.app.state.console
    return c


def origin_of(request: Request) -> Origin:
    server = request.scope.get("server") or ("127.0.0.1", 0)
    client = request.scope.get("client") or ("127.0.0.1", 0)
    return Origin(
        scheme=request.url.scheme,
        host_header=request.headers.get("host") or f"{server[0]}:{server[1]}",
        server=(str(server[0]), int(server[1] or 0)),
        client=(str(client[0]), int(client[1] or 0)),
    )


def cookie_policy_of(request: Request) -> session.CookiePolicy:
    server = request.scope.get("server") or ("", 0)
    return session.cookie_policy(request.url.scheme, str(server[0]), console_of(request).public_url)


def set_cookie(response: Response, request: Request, base: str, value: str, max_age: int) -> None:
    """One of the console's cookies: HttpOnly, SameSite=Lax, /ui/ only, Secure off loopback."""
    policy = cookie_policy_of(request)
    response.set_cookie(
        policy.name(base),
        value,
        max_age=max_age,
        path=session.COOKIE_PATH,
        httponly=True,
        samesite="lax",
        secure=policy.secure,
    )


def delete_cookie(response: Response, request: Request, base: str) -> None:
    policy = cookie_policy_of(request)
    response.delete_cookie(
        policy.name(base),
        path=session.COOKIE_PATH,
        httponly=True,
        samesite="lax",
        secure=policy.secure,
    )


def cookie(request: Request, base: str) -> str | None:
    return request.cookies.get(cookie_policy_of(request).name(base))


class NeedLoginError(Exception):
    """No session, or the API refused its token (expired, user deleted)."""

    def __init__(self, expired: bool) -> None:
        super().__init__("sign in")
        self.expired = expired


@dataclass
class User:
    """The signed-in user of one request: their API view and their CSRF token."""

    request: Request
    console: Console
    token: str
    api: UserApi
    subject: str
    csrf: str

    def render(self, template: str, status: int = 200, /, **context: Any) -> HTMLResponse:
        return self.console.render(
            template, status, user=self, request=self.request, path=self.request.url.path, **context
        )

    @property
    def form(self) -> dict[str, str]:
        form: dict[str, str] = getattr(self.request.state, "form", {})
        return form


def session_token(request: Request) -> str | None:
    return cookie(request, session.SESSION_NAME)


def signed_in(request: Request) -> User:
    """The dependency of every console page but the login ones."""
    token = session_token(request)
    if not token:
        raise NeedLoginError(expired=False)
    c = console_of(request)
    try:
        # Display only: the API verifies the token on every call this page makes.
        subject = str(jwt.decode(token, options={"verify_signature": False}).get("sub", ""))
    except jwt.PyJWTError:
        raise NeedLoginError(expired=True) from None
    return User(
        request,
        c,
        token,
        UserApi(c.api, origin_of(request), token),
        subject,
        session.csrf_token(c.csrf_key, token),
    )


async def read_form(request: Request) -> dict[str, str]:
    """An urlencoded form body (the body limit middleware already bounded it)."""
    raw = (await request.body()).decode("utf-8", "replace")
    return dict(parse_qsl(raw, keep_blank_values=True))


def login_redirect(request: Request, expired: bool) -> Response:
    # A page that makes htmx requests was signed in when it loaded: without a
    # cookie now, the session ended (the browser drops it at Max-Age).
    expired = expired or bool(request.headers.get("hx-request"))
    target = request.url.path
    if request.headers.get("hx-request") and request.headers.get("hx-current-url"):
        current = request.headers["hx-current-url"]
        target = "/" + current.split("://", 1)[-1].split("/", 1)[-1] if "://" in current else target
    url = f"/ui/login?next={quote(session.safe_next(target))}" + ("&expired=1" if expired else "")
    if request.headers.get("hx-trigger") == POLL_TRIGGER:
        # A background poll must not take the user away from a half-filled form:
        # the page's script shows a banner with a link instead.
        return Response(status_code=401, headers={"x-console-login": url})
    if request.headers.get("hx-request"):
        return Response(status_code=200, headers={"HX-Redirect": url})
    return RedirectResponse(url, status_code=303)


def what_to_fix(error: ApiCallError) -> tuple[str, str]:
    """(title, advice) for an API error shown as a page."""
    if error.status == 403:
        return "You do not have permission", (
            f"{error.message}. Ask an administrator of this object for a role that grants it."
        )
    if error.status == 404:
        return (
            "Not found",
            f"{error.message}. It may have been deleted, or the address is mistyped.",
        )
    if error.status == 429:
        return (
            "Too many attempts",
            f"{error.message} (retry after {error.retry_after or 'a minute'} s).",
        )
    if error.status >= 500:
        return "The management plane could not answer", (
            f"{error.message}. Try again in a moment; if it persists, check the server's logs."
        )
    return "The request was refused", error.message


def error_page(request: Request, status: int, title: str, advice: str) -> HTMLResponse:
    c = console_of(request)
    token = session_token(request)
    return c.render(
        "error.html",
        status,
        title=title,
        advice=advice,
        request=request,
        path=request.url.path,
        user=None if not token else _display_user(request, token),
    )


def _display_user(request: Request, token: str) -> User | None:
    try:
        return signed_in(request)
    except NeedLoginError:
        return None


def security_headers(request: Request, response: Response) -> None:
    headers = response.headers
    headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
    headers["X-Content-Type-Options"] = "nosniff"
    headers["X-Frame-Options"] = "DENY"
    headers["Referrer-Policy"] = "same-origin"
    headers.setdefault("Cache-Control", "no-store")
    if request.url.scheme == "https":
        headers["Strict-Transport-Security"] = "max-age=31536000"


def csrf_checked(request: Request, form: Mapping[str, str]) -> bool:
    token = session_token(request)
    presented = form.get(session.CSRF_FIELD) or request.headers.get(session.CSRF_HEADER)
    return session.csrf_ok(console_of(request).csrf_key, token or "", presented)


# Routes that check their own forgery protection (the login form's nonce).
CSRF_EXEMPT = frozenset({"/ui/login"})


class ConsoleRoute(APIRoute):
    """Every console route: CSRF before the handler, headers and error pages after."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                if request.method in UNSAFE:
                    form = await read_form(request)
                    request.state.form = form
                    if request.url.path not in CSRF_EXEMPT and not csrf_checked(request, form):
                        response: Response = error_page(
                            request,
                            403,
                            "This request was refused",
                            "It did not carry this session's security token (CSRF). Reload the "
                            "page and try again; a form from another site cannot act for you.",
                        )
                        security_headers(request, response)
                        return response
                response = await handler(request)
            except (RequestValidationError, HTTPException):
                response = error_page(
                    request,
                    404,
                    "Not found",
                    "This console address is not valid: names are lower-case letters, digits "
                    "and '-'. Check the link.",
                )
            except NeedLoginError as exc:
                response = login_redirect(request, exc.expired)
            except ApiCallError as exc:
                if exc.status == 401:
                    response = login_redirect(request, expired=True)
                else:
                    title, advice = what_to_fix(exc)
                    response = error_page(request, exc.status, title, advice)
            except Exception:
                log.exception("console page failed", extra={"path": request.url.path})
                response = error_page(
                    request,
                    500,
                    "Something went wrong",
                    "The page could not be built. Try again; if it persists, check the "
                    "server's logs.",
                )
            security_headers(request, response)
            return response

        return route
