"""The OAuth protocol clients of ``meshctl login``: RFC 8628, RFC 8693 and the loopback login.

The device-code rules (request forms, answers, RFC 8628 section 3.5 polling
reactions) are shared with the server's async client in
``meshplane.oauth_device``, which imports only the standard library; this
module adds meshctl's transport and its errors and exit codes. meshctl never
imports ``mgmt_api``: it is a client of the public API and may ship alone.

Token values never appear in ``repr``, messages or logs.
"""

from __future__ import annotations

import base64
import hashlib
import html
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from meshctl.errors import ApiFailure, Exit, MeshctlError, one_line
from meshctl.transport import Transport, TransportError, TransportTimeout
from meshplane import oauth_device
from meshplane.oauth_device import DeviceAuthorization, DeviceTokens

TOKEN_EXCHANGE_GRANT = "urn:ietf:params:oauth:grant-type:token-exchange"  # noqa: S105
AUTHORIZATION_CODE_GRANT = "authorization_code"
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"  # noqa: S105 - a URN
ID_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:id_token"  # noqa: S105 - a URN

__all__ = ["DeviceAuthorization", "DeviceLoginError", "DeviceTokens"]


class DeviceLoginError(MeshctlError):
    """The device login ended without tokens; ``error`` is the OAuth error code."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(f"device login failed ({error}): {message}", Exit.AUTH)
        self.error = error


@contextmanager
def _as_meshctl_error() -> Iterator[None]:
    """The shared rules raise ``oauth_device.DeviceFlowError``; meshctl reports it as a
    one-line :class:`DeviceLoginError` with its exit code."""
    try:
        yield
    except oauth_device.DeviceFlowError as exc:
        message = exc.message
        if exc.error == "expired_token":
            message += "; run meshctl login again"
        raise DeviceLoginError(exc.error, message) from None


def next_interval(error: str, interval: float) -> float:
    """RFC 8628 section 3.5: the next polling interval, or raise when the flow ends."""
    with _as_meshctl_error():
        return oauth_device.next_interval(error, interval)


def parse_device_authorization(body: Any) -> DeviceAuthorization:
    with _as_meshctl_error():
        return DeviceAuthorization.from_response(body)


def start_device_authorization(
    http: Transport, endpoint: str, client_id: str, scopes: list[str]
) -> DeviceAuthorization:
    """RFC 8628 section 3.1: ask the provider for a device code and a user code."""
    try:
        response = http.request(
            "POST", endpoint, form=oauth_device.authorization_form(client_id, scopes)
        )
        body = response.json()
    except TransportError as exc:
        raise MeshctlError(
            f"cannot reach the identity provider at {endpoint}: {exc}", Exit.UNREACHABLE
        ) from exc
    except ValueError as exc:
        raise DeviceLoginError(
            "invalid_response", f"the device endpoint {endpoint} did not answer JSON"
        ) from exc
    with _as_meshctl_error():
        if response.status >= 400:
            raise oauth_device.authorization_refused(body)
        return DeviceAuthorization.from_response(body)


def poll_for_tokens(
    http: Transport,
    token_endpoint: str,
    client_id: str,
    authorization: DeviceAuthorization,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> DeviceTokens:
    """RFC 8628 section 3.4: poll until the user approves, denies, or the code expires."""
    deadline = clock() + authorization.expires_in
    interval = authorization.interval
    while True:
        sleep(interval)
        if clock() >= deadline:
            next_interval("expired_token", interval)
        try:
            response = http.request(
                "POST", token_endpoint, form=oauth_device.poll_form(client_id, authorization)
            )
        except TransportTimeout:
            interval = next_interval("slow_down", interval)
            continue
        except TransportError as exc:
            raise MeshctlError(
                f"lost the identity provider while polling ({exc})", Exit.UNREACHABLE
            ) from exc
        try:
            body: Any = response.json()
        except ValueError:
            body = None
        with _as_meshctl_error():
            outcome = oauth_device.poll_outcome(response.status, body)
        if isinstance(outcome, DeviceTokens):
            return outcome
        interval = next_interval(outcome, interval)


@dataclass(frozen=True, slots=True)
class PlatformToken:
    """The management plane's bearer token and its lifetime."""

    access_token: str = field(repr=False)
    expires_in: float | None


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def parse_platform_token(body: Any) -> PlatformToken:
    """Accept the RFC 8693/6749 snake_case body and the API's camelCase one."""
    if isinstance(body, Mapping):
        token = body.get("access_token", body.get("accessToken"))
        if isinstance(token, str) and token:
            return PlatformToken(token, _seconds(body.get("expires_in", body.get("expiresIn"))))
    raise MeshctlError("the management plane answered without an access token", Exit.API_ERROR)


def _post_platform_token(http: Transport, url: str, form: Mapping[str, str]) -> PlatformToken:
    """POST a form to the management plane's token endpoint and read the platform token.

    A refusal keeps the server's reason: OAuth bodies (``error``,
    ``error_description``) and API bodies (``code``, ``message``, ``details``)
    are both rendered, so "only version 2.0 access tokens are accepted"
    reaches the user verbatim.
    """
    try:
        response = http.request("POST", url, form=form)
    except TransportError as exc:
        raise MeshctlError(
            f"cannot reach the management plane's token endpoint {url} ({exc})", Exit.UNREACHABLE
        ) from exc
    try:
        body: Any = response.json()
    except ValueError:
        body = None
    if response.status >= 400:
        failure = ApiFailure.from_response(response.status, body)
        if response.status in {404, 405}:
            raise MeshctlError(
                f"the management plane has no token endpoint at {url} (HTTP "
                f"{response.status}); it does not support this login yet, use "
                "meshctl login --username for a local user",
                Exit.AUTH,
            )
        reason = failure.metadata.get("reason")
        detail = f", {reason}" if reason else ""
        raise MeshctlError(
            f"the management plane refused the login ({failure.code_name} "
            f"{failure.http_status}{detail}): {failure.server_message}",
            Exit.AUTH if failure.http_status in {400, 401, 403} else failure.exit_code,
        )
    return parse_platform_token(body)


def exchange_at_platform(
    http: Transport,
    url: str,
    subject_token: str,
    subject_token_type: str,
    extra: Mapping[str, str] | None = None,
) -> PlatformToken:
    """RFC 8693: trade a provider token for a platform token at the management plane."""
    form = {
        "grant_type": TOKEN_EXCHANGE_GRANT,
        "subject_token": subject_token,
        "subject_token_type": subject_token_type,
        "requested_token_type": ACCESS_TOKEN_TYPE,
        **(extra or {}),
    }
    return _post_platform_token(http, url, form)


def redeem_login_code(
    http: Transport, url: str, code: str, verifier: str, redirect_uri: str
) -> PlatformToken:
    """RFC 8252: the loopback login's one-time code and our PKCE verifier become the token."""
    form = {
        "grant_type": AUTHORIZATION_CODE_GRANT,
        "code": code,
        "code_verifier": verifier,
        "redirect_uri": redirect_uri,
    }
    return _post_platform_token(http, url, form)


@dataclass(frozen=True, slots=True)
class Pkce:
    """meshctl's own PKCE pair (RFC 7636, S256) for one browser login.

    The challenge goes out with the login; the verifier never leaves this
    process until it redeems the code, so a code caught on its way to the
    loopback listener (by another local process, or from browser history)
    is useless to whoever caught it.
    """

    verifier: str = field(repr=False)
    challenge: str

    @classmethod
    def new(cls) -> Pkce:
        verifier = secrets.token_urlsafe(32)  # 43 characters, 256 bits
        digest = hashlib.sha256(verifier.encode("ascii")).digest()
        return cls(verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii"))


# ---- browser login: the loopback redirect (RFC 8252 section 7.3) ------------------------


_DONE_PAGE = (
    "<!doctype html><meta charset=utf-8><title>meshctl</title><h1>{title}</h1><p>{text}</p>"
)


class LoopbackReceiver:
    """A one-shot HTTP listener on 127.0.0.1 that waits for the post-login redirect.

    ``redirect_uri`` carries a random ``state``; only a callback echoing it
    is accepted, so another local page cannot feed meshctl a code of its
    choosing (login CSRF). The callback carries a one-time ``code`` (or an
    ``error``), never a token. The listener binds the loopback interface only
    and serves until it has one acceptable callback or the timeout passes.
    """

    def __init__(self, port: int = 0) -> None:
        self.state = secrets.token_urlsafe(24)
        self._result: dict[str, str] | None = None
        self._done = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(parts.query).items() if v}
                if parts.path != "/callback" or not secrets.compare_digest(
                    query.get("state", ""), receiver.state
                ):
                    self._page(
                        400,
                        "Not this login",
                        "This link does not belong to the "
                        "meshctl login that is waiting. Start the login again.",
                    )
                    return
                if "error" in query:
                    self._page(
                        400,
                        "Login failed",
                        query.get("errorDescription")
                        or query.get("error_description")
                        or query["error"],
                    )
                else:
                    self._page(
                        200, "Login complete", "You can close this window and return to meshctl."
                    )
                if receiver._result is None:
                    receiver._result = query
                    receiver._done.set()

            def _page(self, status: int, title: str, text: str) -> None:
                body = _DONE_PAGE.format(
                    title=html.escape(title), text=html.escape(one_line(text)[:500])
                ).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.send_header("Referrer-Policy", "no-referrer")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                """Silent: the request line holds the login code."""

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def redirect_uri(self) -> str:
        port = self._server.server_address[1]
        return f"http://127.0.0.1:{port}/callback?" + urlencode({"state": self.state})

    def __enter__(self) -> LoopbackReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def wait(self, timeout: float) -> dict[str, str]:
        if not self._done.wait(timeout):
            raise MeshctlError(
                f"no login completed within {int(timeout)} s; run meshctl login again "
                "(or use --use-device-code on a machine without a browser)",
                Exit.AUTH,
            )
        assert self._result is not None
        return self._result
