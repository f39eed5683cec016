"""The async client of the OAuth 2.0 device authorization grant (RFC 8628), on httpx.

The management plane itself never runs this grant: ``meshctl`` does (on its
own transport). This async adapter is for Python callers on httpx and the
tests; the rules (forms, answers, polling reactions) are shared with meshctl
in ``meshplane.oauth_device``, which imports only the standard library.
The loop takes ``sleep`` and ``clock`` so it can be driven quickly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import httpx

from meshplane.oauth_device import (
    DeviceAuthorization,
    DeviceFlowError,
    DeviceTokens,
    authorization_form,
    authorization_refused,
    next_interval,
    poll_form,
    poll_outcome,
)

__all__ = [
    "DeviceAuthorization",
    "DeviceFlowError",
    "DeviceTokens",
    "next_interval",
    "poll_for_tokens",
    "start_device_authorization",
]


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
            data=authorization_form(client_id, scopes),
            headers={"Accept": "application/json"},
        )
        body: Any = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise DeviceFlowError(
            "invalid_response", f"cannot start the device login: {exc.__class__.__name__}"
        ) from exc
    if response.status_code >= 400:
        raise authorization_refused(body)
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
            next_interval("expired_token", interval)
        try:
            response = await http.post(
                token_endpoint,
                data=poll_form(client_id, authorization),
                headers={"Accept": "application/json"},
            )
            body: Any = response.json()
        except ValueError:
            body = None
        except httpx.TransportError:
            # RFC 8628 3.5: treat a connection timeout like slow_down.
            interval = next_interval("slow_down", interval)
            continue
        outcome = poll_outcome(response.status_code, body)
        if isinstance(outcome, DeviceTokens):
            return outcome
        interval = next_interval(outcome, interval)
