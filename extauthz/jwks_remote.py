"""A JWKS fetched over HTTP: TTL cache, stale-if-error, rate-limited kid-miss refetch.

All network I/O happens in a background task, never on the request path:

* ``run()`` fetches at start, then again every ``cache_seconds``; after a
  failure it retries with a capped exponential backoff, while the **last good
  key set keeps serving** (PyJWT #1162 is the outage this avoids).
* ``request_refetch()`` is what a request calls when a token names a ``kid``
  we do not know (the IdP rotated). It starts at most one refetch per
  ``min_refetch_seconds`` (a flood of random kids cannot turn us into a DoS
  amplifier against the IdP) and returns the in-flight fetch, so the adapter
  may wait up to ``kid_miss_wait_seconds`` for it and re-decide once; every
  other request with an unknown kid is denied at once.
* A fetched document that does not parse, or has no usable key, is a failed
  refresh: it never replaces a good set with an empty one.
* ``version`` only changes when the set of keys actually changes, so a
  routine TTL refresh does not flush the verified-token cache.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import httpx

from extauthz import metrics
from extauthz.config import JwksUriConfig
from extauthz.keys import KeyError_, KeySet, parse_jwks

log = logging.getLogger(__name__)

MAX_JWKS_BYTES = 1024 * 1024
_MAX_BACKOFF_SECONDS = 60.0

Fetcher = Callable[[str, float], Awaitable[bytes]]


class FetchError(Exception):
    """The JWKS could not be fetched; the message is safe to log."""


class RemoteJwks:
    def __init__(
        self,
        config: JwksUriConfig,
        *,
        fetch: Fetcher | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._fetch = fetch or self._http_fetch
        self._clock = clock
        self._keys = KeySet()
        self._fingerprints: frozenset[tuple[str | None, str]] = frozenset()
        self._version = 0
        self._inflight: asyncio.Future[bool] | None = None
        self._last_kid_miss: float | None = None
        self._client: httpx.AsyncClient | None = None
        self.loaded = False

    @property
    def keys(self) -> KeySet:
        return self._keys

    @property
    def version(self) -> int:
        return self._version

    @property
    def kid_miss_wait_seconds(self) -> float:
        return self.config.kid_miss_wait_seconds

    async def _http_fetch(self, uri: str, limit_seconds: float) -> bytes:
        if self._client is None:
            self._client = httpx.AsyncClient(follow_redirects=False, trust_env=False)
        try:
            async with self._client.stream(
                "GET", uri, headers={"accept": "application/json"}, timeout=limit_seconds
            ) as response:
                if response.status_code != 200:
                    raise FetchError(f"HTTP {response.status_code}")
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_JWKS_BYTES:
                        raise FetchError("JWKS larger than 1 MiB")
                return bytes(body)
        except httpx.HTTPError as exc:
            raise FetchError(type(exc).__name__) from None

    async def _refresh(self, trigger: str) -> bool:
        try:
            async with asyncio.timeout(self.config.timeout_seconds + 1.0):
                raw = await self._fetch(self.config.uri, self.config.timeout_seconds)
            parsed = parse_jwks(raw)
        except (FetchError, KeyError_, TimeoutError, OSError) as exc:
            metrics.KEY_REFRESHES.labels(trigger, "error").inc()
            log.warning(
                "JWKS refresh failed; keeping the last good keys",
                extra={
                    "uri": self.config.uri,
                    "trigger": trigger,
                    "error": str(exc) or type(exc).__name__,
                    "keys_in_use": len(self._keys.keys),
                },
            )
            return False
        metrics.KEY_REFRESHES.labels(trigger, "success").inc()
        fingerprints = frozenset((k.kid, k.fingerprint()) for k in parsed.keys.keys)
        changed = fingerprints != self._fingerprints
        if changed:
            self._keys = parsed.keys
            self._fingerprints = fingerprints
            self._version += 1
        self.loaded = True
        log.info(
            "JWKS refreshed",
            extra={
                "uri": self.config.uri,
                "trigger": trigger,
                "keys": len(parsed.keys.keys),
                "changed": changed,
                "skipped": list(parsed.skipped),
            },
        )
        return True

    def _start(self, trigger: str) -> asyncio.Future[bool]:
        if self._inflight is None or self._inflight.done():
            self._inflight = asyncio.ensure_future(self._refresh(trigger))
        return self._inflight

    async def refresh(self, trigger: str = "manual") -> bool:
        """Fetch now (joining a fetch already in flight); True on success."""
        return await asyncio.shield(self._start(trigger))

    def request_refetch(self) -> asyncio.Future[bool] | None:
        """Kid-miss refetch, rate-limited; see the module docstring."""
        if self._inflight is not None and not self._inflight.done():
            return self._inflight
        now = self._clock()
        if (
            self._last_kid_miss is not None
            and now - self._last_kid_miss < self.config.min_refetch_seconds
        ):
            return None
        self._last_kid_miss = now
        return self._start("kid_miss")

    async def run(self) -> None:
        """Refresh forever: every ``cache_seconds``, with backoff after failures."""
        backoff = 1.0
        if self.loaded:  # the app already did the initial fetch
            await asyncio.sleep(self.config.cache_seconds)
        while True:
            ok = await self.refresh("ttl" if self.loaded else "initial")
            if ok:
                backoff = 1.0
                delay = self.config.cache_seconds
            else:
                delay = min(backoff, self.config.cache_seconds)
                backoff = min(backoff * 2, _MAX_BACKOFF_SECONDS)
            await asyncio.sleep(delay)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
