"""The rules of the OAuth 2.0 device authorization grant (RFC 8628), without any I/O.

The management plane never runs this grant; ``meshctl login
--use-device-code`` does, with its own ``http.client`` transport
(``meshctl.oauth``, the one polling loop; the server's tests drive the
real provider through it too). What does not depend on a transport lives
here: the request forms, parsing of the answers, and the polling reactions.
This module imports only the standard library, so meshctl can use it
without the server's dependencies.

Polling reactions (RFC 8628 section 3.5): ``authorization_pending`` keeps the
interval, ``slow_down`` adds 5 s to this and every later poll (a transport
timeout counts as ``slow_down``), ``access_denied`` and ``expired_token`` end
the flow, and so does any other error. A missing ``interval`` means 5 s; the
code's ``expires_in`` is a hard deadline.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

DEVICE_CODE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
DEFAULT_INTERVAL_S = 5.0  # RFC 8628 3.2: the default when the server sends none
SLOW_DOWN_STEP_S = 5.0  # RFC 8628 3.5: add 5 seconds on every slow_down


class DeviceFlowError(Exception):
    """The device login ended without tokens; ``error`` is the OAuth error code."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


@dataclass(frozen=True, slots=True)
class DeviceAuthorization:
    """The device authorization response (RFC 8628 3.2). The device code stays out of repr."""

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
            if isinstance(interval, int | float) and not isinstance(interval, bool) and interval > 0
            else DEFAULT_INTERVAL_S,
        )


@dataclass(frozen=True, slots=True)
class DeviceTokens:
    """The tokens issued at the end of the flow. Kept out of ``repr``."""

    access_token: str = field(repr=False)
    token_type: str = "Bearer"  # noqa: S105 - a token type name, not a secret
    id_token: str | None = field(default=None, repr=False)
    refresh_token: str | None = field(default=None, repr=False)
    expires_in: float | None = None


def authorization_form(client_id: str, scopes: Iterable[str]) -> dict[str, str]:
    """The body of the device authorization request (RFC 8628 3.1)."""
    return {"client_id": client_id, "scope": " ".join(scopes)}


def authorization_refused(body: Any) -> DeviceFlowError:
    """The error for a refused device authorization request (HTTP 4xx/5xx)."""
    error = str(body.get("error", "invalid_request")) if isinstance(body, Mapping) else "?"
    description = body.get("error_description") if isinstance(body, Mapping) else None
    detail = f": {description}" if isinstance(description, str) and description else ""
    message = f"the identity provider refused the device login ({error}){detail}"
    return DeviceFlowError(error, message)


def poll_form(client_id: str, authorization: DeviceAuthorization) -> dict[str, str]:
    """The body of one token request while polling (RFC 8628 3.4)."""
    return {
        "grant_type": DEVICE_CODE_GRANT,
        "device_code": authorization.device_code,
        "client_id": client_id,
    }


def next_interval(error: str, interval: float) -> float:
    """The reaction to a polling error: the next interval, or ``DeviceFlowError`` to stop."""
    if error == "authorization_pending":
        return interval
    if error == "slow_down":
        return interval + SLOW_DOWN_STEP_S
    if error == "access_denied":
        raise DeviceFlowError(error, "the sign-in was denied at the identity provider")
    if error == "expired_token":
        raise DeviceFlowError(error, "the device code expired before the sign-in finished")
    raise DeviceFlowError(error or "invalid_response", f"the identity provider answered {error!r}")


def poll_outcome(status: int, body: Any) -> DeviceTokens | str:
    """One polling answer: the tokens, or the OAuth error code to hand to ``next_interval``."""
    if not isinstance(body, Mapping):
        raise DeviceFlowError("invalid_response", "the token endpoint did not answer JSON")
    token = body.get("access_token")
    if status < 400 and isinstance(token, str):
        expires = body.get("expires_in")
        id_token, refresh = body.get("id_token"), body.get("refresh_token")
        return DeviceTokens(
            access_token=token,
            token_type=str(body.get("token_type", "Bearer")),
            id_token=id_token if isinstance(id_token, str) else None,
            refresh_token=refresh if isinstance(refresh, str) else None,
            expires_in=float(expires) if isinstance(expires, int | float) else None,
        )
    return str(body.get("error", ""))
