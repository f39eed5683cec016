"""The provider's signing keys: fetched, cached with a TTL, refetched on an unknown ``kid``.

Providers rotate keys by publishing the new key before signing with it, so
a token with an unknown ``kid`` usually means our copy is stale: we refetch
once. To stop a flood of tokens with made-up ``kid`` values from turning
into a flood of requests to the provider, refetches are spaced by at least
``min_refetch_interval_s``. A failed refetch keeps the keys we had.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import jwt

from mgmt_api.identity.errors import InvalidTokenError, ProviderError

# Asymmetric algorithms only: HS* would let anyone holding the client secret
# mint tokens, and "none" is no signature at all.
DEFAULT_ALLOWED_ALGS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)


@dataclass(frozen=True, slots=True)
class SigningKey:
    """One public key of the provider; ``alg`` is the algorithm the JWK pins, if any."""

    kid: str
    key: Any
    alg: str | None


class JwksCache:
    """The JWKS of one provider."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        jwks_uri: str,
        *,
        ttl_s: float = 3600.0,
        min_refetch_interval_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._http = http
        self._uri = jwks_uri
        self._ttl = ttl_s
        self._min_refetch = min_refetch_interval_s
        self._clock = clock
        self._keys: dict[str, SigningKey] = {}
        self._fetched_at: float | None = None
        self._lock = asyncio.Lock()

    @property
    def uri(self) -> str:
        return self._uri

    async def _fetch(self) -> None:
        try:
            response = await self._http.get(self._uri, headers={"Accept": "application/json"})
            response.raise_for_status()
            document = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise ProviderError(
                f"cannot fetch the provider's keys from {self._uri}: {exc}"
            ) from exc
        keys = parse_jwks(document)
        self._keys = keys
        self._fetched_at = self._clock()

    async def key_for(self, kid: str | None) -> SigningKey:
        """The signing key for ``kid`` (or the only key, when a token has no ``kid``)."""
        async with self._lock:
            now = self._clock()
            stale = self._fetched_at is None or now - self._fetched_at >= self._ttl
            unknown = self._lookup(kid) is None
            may_refetch = self._fetched_at is None or now - self._fetched_at >= self._min_refetch
            if stale or (unknown and may_refetch):
                try:
                    await self._fetch()
                except ProviderError:
                    if not self._keys:
                        raise
            key = self._lookup(kid)
        if key is None:
            raise InvalidTokenError("the token is signed with an unknown key", reason="unknown_kid")
        return key

    def _lookup(self, kid: str | None) -> SigningKey | None:
        if kid is not None:
            return self._keys.get(kid)
        return next(iter(self._keys.values())) if len(self._keys) == 1 else None


class ProviderKeys:
    """The JWKS cache of one OIDC configuration, shared by everything that verifies its tokens.

    The browser login, the device login and token exchange all verify
    tokens of the same provider; one cache means one fetch per refresh and
    one refetch budget for unknown ``kid`` values, instead of one per
    verifier. A new ``jwks_uri`` in discovery replaces the cache.
    """

    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http
        self._cache: JwksCache | None = None

    def for_uri(self, jwks_uri: str) -> JwksCache:
        if self._cache is None or self._cache.uri != jwks_uri:
            self._cache = JwksCache(self._http, jwks_uri)
        return self._cache


def parse_jwks(document: Any) -> dict[str, SigningKey]:
    """The usable signing keys of a JWKS document, by ``kid``; others are skipped."""
    if not isinstance(document, Mapping) or not isinstance(document.get("keys"), list):
        raise ProviderError("the provider's JWKS is not a JSON object with a 'keys' list")
    keys: dict[str, SigningKey] = {}
    for index, entry in enumerate(document["keys"]):
        if not isinstance(entry, Mapping) or entry.get("use", "sig") != "sig":
            continue
        if entry.get("kty") not in {"RSA", "EC", "OKP"}:
            continue  # symmetric or unknown key types never verify provider tokens
        try:
            key = jwt.PyJWK(dict(entry))
        except (jwt.PyJWKError, jwt.InvalidKeyError):
            continue  # a curve or key we cannot use
        kid = str(entry.get("kid", f"#{index}"))
        alg = entry.get("alg")
        keys[kid] = SigningKey(kid=kid, key=key.key, alg=alg if isinstance(alg, str) else None)
    return keys


async def verify_jwt(
    token: str,
    jwks: JwksCache,
    *,
    allowed_algs: frozenset[str] = DEFAULT_ALLOWED_ALGS,
) -> dict[str, Any]:
    """Check the signature of ``token`` and return its claims, unchecked otherwise.

    Time, issuer and audience are checked by the caller with ``claims``,
    using its own clock.
    """
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise InvalidTokenError("the token is not a well-formed JWT", reason="malformed") from exc
    alg = header.get("alg")
    if not isinstance(alg, str) or alg not in allowed_algs:
        raise InvalidTokenError(
            f"the token's signing algorithm {alg!r} is not allowed", reason="alg_not_allowed"
        )
    kid = header.get("kid")
    key = await jwks.key_for(kid if isinstance(kid, str) else None)
    if key.alg is not None and key.alg != alg:
        raise InvalidTokenError(
            "the token's algorithm does not match its key", reason="alg_mismatch"
        )
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            key=key.key,
            algorithms=[alg],
            options={
                "verify_signature": True,
                "verify_exp": False,
                "verify_iat": False,
                "verify_nbf": False,
                "verify_aud": False,
                "verify_iss": False,
                "require": [],
            },
        )
    except jwt.PyJWTError as exc:
        raise InvalidTokenError(
            "the token's signature is not valid", reason="bad_signature"
        ) from exc
    return claims
