"""The OAuth protocol clients of ``meshctl login``: RFC 8628, RFC 8693 and the loopback redirect.

**Why not import ``mgmt_api.identity.device_code``?** It would work (that
module needs only httpx), but meshctl is a client of the public API and must
not depend on the server package: it may be shipped alone, and a refactor of
the server must never break the CLI. The device-code client is small, and
meshctl is synchronous (one command, then exit), so it is reimplemented here
with the same rules (RFC 8628 section 3.5): ``authorization_pending`` keeps
the interval, ``slow_down`` adds 5 s to this and every later poll,
``access_denied`` and ``expired_token`` end the flow, a transport timeout
counts as ``slow_down``, and a missing ``interval`` means 5 s.

Token values never appear in ``repr``, messages or logs.
"""

from __future__ import annotations

import html
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from meshctl.errors import ApiFailure, Exit, MeshctlError, one_line
from meshctl.transport import Transport, TransportError, TransportTimeout

DEVICE_CODE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
TOKEN_EXCHANGE_GRANT = "urn:ietf:params:oauth:grant-type:token-exchange"  # noqa: S105
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"  # noqa: S105 - a URN
ID_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:id_token"  # noqa: S105 - a URN
DEFAULT_INTERVAL_S = 5.0
SLOW_DOWN_STEP_S = 5.0


class DeviceFlowError(MeshctlError):
    """The device login ended without tokens; ``error`` is the OAuth error code."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(f"device login failed ({error}): {message}", Exit.AUTH)
        self.error = error


@dataclass(frozen=True, slots=True)
class DeviceAuthorization:
    """RFC 8628 section 3.2 response. The device code is secret-ish: kept out of repr."""

    device_code: str = field(repr=False)
    user_code: str
    verification_uri: str
    verification_uri_complete: str | None
    expires_in: float
    interval: float

    @classmethod
    def from_response(cls, body: Any) -> DeviceAuthorization:
        if not isinstance(body, Mapping):
            raise DeviceFlowError("invalid_response", "the device endpoint did not answer JSON")
        try:
            uri = body.get("verification_uri") or body["verification_url"]
            expires = float(body["expires_in"])
            device_code, user_code = str(body["device_code"]), str(body["user_code"])
        except (KeyError, TypeError, ValueError) as exc:
            raise DeviceFlowError(
                "invalid_response", f"the device endpoint's answer lacks {exc}"
            ) from exc
        interval = body.get("interval")
        complete = body.get("verification_uri_complete")
        return cls(
            device_code=device_code,
            user_code=user_code,
            verification_uri=str(uri),
            verification_uri_complete=complete if isinstance(complete, str) else None,
            expires_in=expires,
            interval=float(interval)
            if isinstance(interval, int | float) and interval > 0
            else DEFAULT_INTERVAL_S,
        )


@dataclass(frozen=True, slots=True)
class ProviderTokens:
    access_token: str = field(repr=False)
    id_token: str | None = field(default=None, repr=False)


def next_interval(error: str, interval: float) -> float:
    """RFC 8628 section 3.5: the next polling interval, or raise when the flow ends."""
    if error == "authorization_pending":
        return interval
    if error == "slow_down":
        return interval + SLOW_DOWN_STEP_S
    if error == "access_denied":
        raise DeviceFlowError(error, "the sign-in was denied at the identity provider")
    if error == "expired_token":
        raise DeviceFlowError(
            error, "the code expired before the sign-in finished; run meshctl login again"
        )
    raise DeviceFlowError(error or "invalid_response", "the identity provider refused the login")


def start_device_authorization(
    http: Transport, endpoint: str, client_id: str, scopes: list[str]
) -> DeviceAuthorization:
    """RFC 8628 section 3.1: ask the provider for a device code and a user code."""
    try:
        response = http.request(
            "POST", endpoint, form={"client_id": client_id, "scope": " ".join(scopes)}
        )
        body = response.json()
    except TransportError as exc:
        raise MeshctlError(
            f"cannot reach the identity provider at {endpoint}: {exc}", Exit.UNREACHABLE
        ) from exc
    except ValueError as exc:
        raise DeviceFlowError(
            "invalid_response", f"the device endpoint {endpoint} did not answer JSON"
        ) from exc
    if response.status >= 400:
        error = body.get("error", "invalid_request") if isinstance(body, Mapping) else "?"
        description = body.get("error_description", "") if isinstance(body, Mapping) else ""
        raise DeviceFlowError(str(error), f"the identity provider refused: {description}")
    return DeviceAuthorization.from_response(body)


def poll_for_tokens(
    http: Transport,
    token_endpoint: str,
    client_id: str,
    authorization: DeviceAuthorization,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> ProviderTokens:
    """RFC 8628 section 3.4: poll until the user approves, denies, or the code expires."""
    deadline = clock() + authorization.expires_in
    interval = authorization.interval
    while True:
        sleep(interval)
        if clock() >= deadline:
            next_interval("expired_token", interval)
        try:
            response = http.request(
                "POST",
                token_endpoint,
                form={
                    "grant_type": DEVICE_CODE_GRANT,
                    "device_code": authorization.device_code,
                    "client_id": client_id,
                },
            )
        except TransportTimeout:
            interval = next_interval("slow_down", interval)
            continue
        except TransportError as exc:
            raise MeshctlError(
                f"lost the identity provider while polling ({exc})", Exit.UNREACHABLE
            ) from exc
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, Mapping):
            raise DeviceFlowError("invalid_response", "the token endpoint did not answer JSON")
        token = body.get("access_token")
        if response.status < 400 and isinstance(token, str):
            id_token = body.get("id_token")
            return ProviderTokens(token, id_token if isinstance(id_token, str) else None)
        interval = next_interval(str(body.get("error", "")), interval)


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


def exchange_at_platform(
    http: Transport,
    url: str,
    subject_token: str,
    subject_token_type: str,
    extra: Mapping[str, str] | None = None,
) -> PlatformToken:
    """RFC 8693: trade a provider token for a platform token at the management plane.

    A refusal keeps the server's reason: OAuth bodies (``error``,
    ``error_description``) and API bodies (``code``, ``message``, ``details``)
    are both rendered, so "only version 2.0 access tokens are accepted"
    reaches the user verbatim.
    """
    form = {
        "grant_type": TOKEN_EXCHANGE_GRANT,
        "subject_token": subject_token,
        "subject_token_type": subject_token_type,
        "requested_token_type": ACCESS_TOKEN_TYPE,
        **(extra or {}),
    }
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


# ---- browser login: the loopback redirect (RFC 8252 section 7.3) ------------------------


_DONE_PAGE = (
    "<!doctype html><meta charset=utf-8><title>meshctl</title><h1>{title}</h1><p>{text}</p>"
)


class LoopbackReceiver:
    """A one-shot HTTP listener on 127.0.0.1 that waits for the post-login redirect.

    ``redirect_uri`` carries a random ``state``; only a callback echoing it
    is accepted, so another local page cannot feed meshctl a token of its
    choosing. The listener binds the loopback interface only and serves
    until it has one acceptable callback or the timeout passes.
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
                """Silent: the request line holds the token."""

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
