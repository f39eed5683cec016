"""HTTP to a proxy's admin listener, for allow-listed requests only.

Every request passes :func:`agent.admin.check` again here, at the last point
before the socket, so no code path can send anything else. Answers are
read up to a size cap (a config dump of a large mesh can be hundreds of
megabytes), and every call has a deadline; the failures become
:class:`AdminCallError` with the gRPC code the caller will see:

- connection refused or reset: UNAVAILABLE, naming the proxy;
- no answer in time (a hung proxy): DEADLINE_EXCEEDED;
- an answer above the cap: RESOURCE_EXHAUSTED, naming the cap.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx

from agent import admin
from agent.contract import StatusCode
from agent.discovery import Proxy

DEFAULT_MAX_RESPONSE_BYTES = 32 * 1024 * 1024


class AdminCallError(Exception):
    """A failed admin call, with the gRPC code the caller will see."""

    def __init__(self, code: StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class AdminAnswer:
    status: int
    body: bytes


class AdminClient:
    """One connection pool for every proxy's admin listener."""

    def __init__(self, max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES) -> None:
        self.max_response_bytes = max_response_bytes
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(60.0),  # a backstop: each call has its own deadline
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
            trust_env=False,  # never through an HTTP proxy from the environment
        )

    async def close(self) -> None:
        await self._http.aclose()

    async def call(self, proxy: Proxy, request: admin.AdminRequest, within: float) -> AdminAnswer:
        admin.check(request)
        url = f"http://{proxy.admin_address}{request.target()}"
        try:
            async with asyncio.timeout(within):
                async with self._http.stream(request.method, url) as response:
                    body = bytearray()
                    async for chunk in response.aiter_raw():
                        body += chunk
                        if len(body) > self.max_response_bytes:
                            raise AdminCallError(
                                StatusCode.RESOURCE_EXHAUSTED,
                                f"the answer of {proxy.name} to {request.path} is larger than "
                                f"{self.max_response_bytes} bytes (the agent's "
                                "--max-response-bytes); narrow it (resource, mask, filter)",
                            )
                    return AdminAnswer(response.status_code, bytes(body))
        except TimeoutError:
            raise AdminCallError(
                StatusCode.DEADLINE_EXCEEDED,
                f"proxy {proxy.name} did not answer {request.path} within {within:g}s",
            ) from None
        except httpx.TransportError as exc:
            raise AdminCallError(
                StatusCode.UNAVAILABLE,
                f"proxy {proxy.name} (admin {proxy.admin_address}) is unreachable: "
                f"{type(exc).__name__}: {exc}",
            ) from None
