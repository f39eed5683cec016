"""HTTP to a proxy's admin listener, for allow-listed requests only.

Every request passes :func:`agent.admin.check` again here, at the last point
before the socket, so no code path can send anything else. Answers are
read up to a size cap (a config dump of a large mesh can be hundreds of
megabytes), and every call has a deadline; the failures become
:class:`AdminCallError` with the gRPC code the caller will see:

- connection refused or reset: UNAVAILABLE, naming the proxy;
- no answer in time (a hung proxy): DEADLINE_EXCEEDED;
- an answer above the cap: RESOURCE_EXHAUSTED, naming the cap.

A sidecar (``Proxy.mtls``) is reached over HTTPS on its diagnostics port
with the agent's mesh certificate (:mod:`agent.mesh_identity`); its
certificate must chain to the mesh CA and name a SPIFFE id of the proxy's
namespace, or the call is UNAVAILABLE and nothing is sent.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from typing import Any

import httpx

from agent import admin
from agent.contract import StatusCode
from agent.discovery import Proxy
from agent.mesh_identity import MeshIdentity, NoCertificate

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

    def __init__(
        self,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        mesh: MeshIdentity | None = None,
    ) -> None:
        self.max_response_bytes = max_response_bytes
        self.mesh = mesh
        self._http = _client(None)
        self._mtls: tuple[int, httpx.AsyncClient] | None = None  # per certificate serial

    async def close(self) -> None:
        await self._http.aclose()
        if self._mtls is not None:
            await self._mtls[1].aclose()

    async def _client_for(self, proxy: Proxy) -> tuple[str, httpx.AsyncClient]:
        """The URL scheme and client of ``proxy``: mTLS with the current certificate."""
        if not proxy.mtls:
            return "http", self._http
        if self.mesh is None:
            raise AdminCallError(
                StatusCode.UNAVAILABLE,
                f"proxy {proxy.name} is a sidecar; the agent has no mesh identity "
                "(--workload-token) to reach it with",
            )
        try:
            serial, context = self.mesh.context()
        except NoCertificate as exc:
            raise AdminCallError(StatusCode.UNAVAILABLE, str(exc)) from None
        if self._mtls is None or self._mtls[0] != serial:
            old, self._mtls = self._mtls, (serial, _client(context))
            if old is not None:
                await old[1].aclose()
        return "https", self._mtls[1]

    async def call(self, proxy: Proxy, request: admin.AdminRequest, within: float) -> AdminAnswer:
        admin.check(request)
        scheme, client = await self._client_for(proxy)
        url = f"{scheme}://{proxy.admin_address}{request.target()}"
        try:
            async with asyncio.timeout(within):
                async with client.stream(request.method, url) as response:
                    if proxy.mtls:
                        _check_peer(proxy, response.extensions.get("network_stream"))
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


def _client(context: ssl.SSLContext | None) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        timeout=httpx.Timeout(60.0),  # a backstop: each call has its own deadline
        limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        trust_env=False,  # never through an HTTP proxy from the environment
        verify=context if context is not None else True,
    )


def _check_peer(proxy: Proxy, stream: Any) -> None:
    """The sidecar's certificate names a SPIFFE id of the proxy's namespace (the chain to
    the mesh CA was checked in the handshake)."""
    ssl_object = stream.get_extra_info("ssl_object") if stream is not None else None
    peer = ssl_object.getpeercert() if ssl_object is not None else None
    uris = [v for k, v in (peer or {}).get("subjectAltName", ()) if k == "URI"]
    if not any(_namespace_of(uri) == proxy.namespace for uri in uris):
        raise AdminCallError(
            StatusCode.UNAVAILABLE,
            f"proxy {proxy.name} (admin {proxy.admin_address}) presented no certificate of "
            f"namespace {proxy.namespace}: {uris[:2]}",
        )


def _namespace_of(uri: str) -> str | None:
    """NS of ``spiffe://TD/ns/NS/sa/SA``, else None."""
    parts = uri.split("/")
    if len(parts) == 7 and parts[:2] == ["spiffe:", ""] and parts[3] == "ns" and parts[5] == "sa":
        return parts[4]
    return None
