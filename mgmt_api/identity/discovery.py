"""OpenID Provider discovery (``.well-known/openid-configuration``), fetched and cached.

The metadata changes rarely, so it is cached for ``ttl_s``; when a refresh
fails, the last good copy keeps serving logins (an IdP blip should not log
everyone out) and the failure is raised only if we never had a copy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from mgmt_api.identity.errors import ProviderError

WELL_KNOWN_SUFFIX = "/.well-known/openid-configuration"


@dataclass(frozen=True, slots=True)
class ProviderMetadata:
    """The parts of the discovery document meshplane uses."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    device_authorization_endpoint: str | None
    token_endpoint_auth_methods: tuple[str, ...]
    code_challenge_methods: tuple[str, ...]
    id_token_signing_algs: tuple[str, ...]
    grant_types: tuple[str, ...]

    def token_auth_method(self) -> str:
        """``client_secret_basic`` unless the provider only offers ``client_secret_post``.

        Basic is the RFC 6749 default and the one every provider must
        support when it advertises nothing.
        """
        methods = self.token_endpoint_auth_methods or ("client_secret_basic",)
        if "client_secret_basic" in methods:
            return "client_secret_basic"
        if "client_secret_post" in methods:
            return "client_secret_post"
        raise ProviderError(
            "the provider supports neither client_secret_basic nor client_secret_post "
            f"(it offers {', '.join(methods)})"
        )


def _endpoint(doc: Mapping[str, Any], name: str, *, required: bool = True) -> str | None:
    value = doc.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or urlsplit(value).scheme not in {"http", "https"}:
        raise ProviderError(f"the discovery document has no valid {name!r}")
    return value


def _strings(doc: Mapping[str, Any], name: str) -> tuple[str, ...]:
    value = doc.get(name)
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, str))
    return ()


def parse_metadata(document: Any, configuration_uri: str) -> ProviderMetadata:
    """Validate a discovery document fetched from ``configuration_uri``.

    The issuer must be the configuration URI without the well-known suffix
    (OIDC Discovery 4.3): otherwise a compromised or mistyped document could
    make us accept tokens from another issuer.
    """
    if not isinstance(document, Mapping):
        raise ProviderError("the discovery document is not a JSON object")
    issuer = document.get("issuer")
    if not isinstance(issuer, str) or not issuer:
        raise ProviderError("the discovery document has no issuer")
    if configuration_uri.endswith(WELL_KNOWN_SUFFIX):
        expected = configuration_uri[: -len(WELL_KNOWN_SUFFIX)]
        if issuer.rstrip("/") != expected.rstrip("/"):
            raise ProviderError(
                f"the discovery document's issuer {issuer!r} does not match {expected!r}"
            )
    challenge = _strings(document, "code_challenge_methods_supported")
    if challenge and "S256" not in challenge:
        raise ProviderError("the provider does not support PKCE with S256")
    return ProviderMetadata(
        issuer=issuer,
        authorization_endpoint=str(_endpoint(document, "authorization_endpoint")),
        token_endpoint=str(_endpoint(document, "token_endpoint")),
        jwks_uri=str(_endpoint(document, "jwks_uri")),
        device_authorization_endpoint=_endpoint(
            document, "device_authorization_endpoint", required=False
        ),
        token_endpoint_auth_methods=_strings(document, "token_endpoint_auth_methods_supported"),
        code_challenge_methods=challenge,
        id_token_signing_algs=_strings(document, "id_token_signing_alg_values_supported"),
        grant_types=_strings(document, "grant_types_supported"),
    )


class DiscoveryCache:
    """Provider metadata per configuration URI, refreshed every ``ttl_s``."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        *,
        ttl_s: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._http = http
        self._ttl = ttl_s
        self._clock = clock
        self._entries: dict[str, tuple[float, ProviderMetadata]] = {}
        self._lock = asyncio.Lock()

    async def get(self, configuration_uri: str) -> ProviderMetadata:
        async with self._lock:
            cached = self._entries.get(configuration_uri)
            now = self._clock()
            if cached is not None and now - cached[0] < self._ttl:
                return cached[1]
            try:
                metadata = await self._fetch(configuration_uri)
            except ProviderError:
                if cached is not None:
                    return cached[1]
                raise
            self._entries[configuration_uri] = (now, metadata)
            return metadata

    async def _fetch(self, configuration_uri: str) -> ProviderMetadata:
        try:
            response = await self._http.get(
                configuration_uri, headers={"Accept": "application/json"}
            )
            response.raise_for_status()
            document = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise ProviderError(
                f"cannot fetch the provider configuration from {configuration_uri}: "
                f"{exc.__class__.__name__}"
            ) from exc
        return parse_metadata(document, configuration_uri)
