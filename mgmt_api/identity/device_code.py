"""The client side of the OAuth 2.0 device authorization grant (RFC 8628).

``meshctl login --use-device-code`` runs this against the identity provider;
the management plane never does. It lives here, next to the rest of the
identity code, but imports only the standard library and httpx (a test
checks this), so the CLI can import it without pulling in FastAPI or
SQLAlchemy and without reaching into server internals: it is a protocol
client, not part of the server.

The polling rules are a pure function (``next_poll``), table-tested; the
loop around it takes ``sleep`` and ``clock`` so it can be driven quickly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

DEVICE_CODE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
DEFAULT_INTERVAL_S = 5.0  # RFC 8628 3.2: the default when the server sends none
SLOW_DOWN_STEP_S = 5.0  # RFC 8628 3.5: add 5 seconds on every slow_down


class DeviceFlowError(Exception):
    """The device login failed; ``error`` is the OAuth error code."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(message)
        self.error = error


@dataclass(frozen=True, slots=True)
class DeviceAuthorization:
    """The device authorization response (RFC 8628 3.2)."""

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
            device_code = body["device_code"]
            user_code = body["user_code"]
            uri = body.get("verification_uri") or body["verification_url"]
            expires = float(body["expires_in"])
        except (KeyError, TypeError, ValueError) as exc:
            raise DeviceFlowError(
                "invalid_response", f"the device endpoint's answer lacks {exc}"
            ) from exc
        interval = body.get("interval")
        complete = body.get("verification_uri_complete")
        return cls(
            device_code=str(device_code),
            user_code=str(user_code),
            verification_uri=str(uri),
            verification_uri_complete=str(complete) if isinstance(complete, str) else None,
            expires_in=expires,
            interval=float(interval) if isinstance(interval, int | float) else DEFAULT_INTERVAL_S,
        )


@dataclass(frozen=True, slots=True)
class DeviceTokens:
    """The tokens issued at the end of the flow. Kept out of ``repr``."""

    access_token: str = field(repr=False)
    token_type: str
    id_token: str | None = field(default=None, repr=False)
    refresh_token: str | None = field(default=None, repr=False)
    expires_in: float | None = None


@dataclass(frozen=True, slots=True)
class PollStep:
    """What to do after one poll: wait ``interval`` and poll again, or stop."""

    interval: float
    done: bool = False


def next_poll(error: str, interval: float) -> PollStep:
    """RFC 8628 3.5: the reaction to a token endpoint error while polling.

    ``authorization_pending`` keeps the interval, ``slow_down`` adds 5
    seconds for this and every later poll, ``access_denied`` and
    ``expired_token`` end the flow, and so does any other error.
    """
    if error == "authorization_pending":
        return PollStep(interval=interval)
    if error == "slow_down":
        return PollStep(interval=interval + SLOW_DOWN_STEP_S)
    if error == "access_denied":
        raise DeviceFlowError(error, "the sign-in was denied at the identity provider")
    if error == "expired_token":
        raise DeviceFlowError(error, "the device code expired before the sign-in finished")
    raise DeviceFlowError(error or "invalid_response", f"the identity provider answered {error!r}")


async def start_device_authorization(
    http: httpx.AsyncClient,
    device_authorization_endpoint: str,
    client_id: str,
    scopes: Iterable[str] = ("openid", "email", "profile"),
) -> DeviceAuthorization:
    """Ask for a device code and user code (RFC 8628 3.1)."""
    try:
        response = await http.post(
            device_authorization_endpoint,
            data={"client_id": client_id, "scope": " ".join(scopes)},
            headers={"Accept": "application/json"},
        )
        body = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise DeviceFlowError(
            "invalid_response", f"cannot start the device login: {exc.__class__.__name__}"
        ) from exc
    if response.status_code >= 400:
        error = body.get("error", "invalid_request") if isinstance(body, Mapping) else "?"
        raise DeviceFlowError(
            str(error), f"the identity provider refused the device login: {error}"
        )
    return DeviceAuthorization.from_response(body)


async def poll_for_tokens(
    http: httpx.AsyncClient,
    token_endpoint: str,
    client_id: str,
    authorization: DeviceAuthorization,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> DeviceTokens:
    """Poll the token endpoint until the user approves, denies, or the code expires."""
    deadline = clock() + authorization.expires_in
    interval = authorization.interval
    while True:
        await sleep(interval)
        if clock() >= deadline:
            raise DeviceFlowError(
                "expired_token", "the device code expired before the sign-in finished"
            )
        try:
            response = await http.post(
                token_endpoint,
                data={
                    "grant_type": DEVICE_CODE_GRANT,
                    "device_code": authorization.device_code,
                    "client_id": client_id,
                },
                headers={"Accept": "application/json"},
            )
            body = response.json()
        except ValueError as exc:
            raise DeviceFlowError(
                "invalid_response", "the token endpoint did not answer JSON"
            ) from exc
        except httpx.TransportError:
            # RFC 8628 3.5: treat a connection timeout like slow_down.
            interval = next_poll("slow_down", interval).interval
            continue
        if not isinstance(body, Mapping):
            raise DeviceFlowError("invalid_response", "the token endpoint did not answer JSON")
        if response.status_code < 400 and isinstance(body.get("access_token"), str):
            expires = body.get("expires_in")
            return DeviceTokens(
                access_token=body["access_token"],
                token_type=str(body.get("token_type", "Bearer")),
                id_token=body.get("id_token") if isinstance(body.get("id_token"), str) else None,
                refresh_token=body.get("refresh_token")
                if isinstance(body.get("refresh_token"), str)
                else None,
                expires_in=float(expires) if isinstance(expires, int | float) else None,
            )
        interval = next_poll(str(body.get("error", "")), interval).interval
