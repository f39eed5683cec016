"""RemoteJwks state machine with an in-memory fetcher and a fake clock.

The HTTP behaviour is covered against a real key server in test_jwks.py;
here the fetcher is replaced (no sockets) to pin down the rate limit, the
sharing of in-flight fetches and the version rules deterministically.
"""

from __future__ import annotations

import asyncio
import json

from extauthz.config import JwksUriConfig
from extauthz.jwks_remote import FetchError, RemoteJwks

from .jwtkit import ec_key, public_jwk


class FakeIdP:
    def __init__(self) -> None:
        self.document: object = {"keys": [public_jwk(ec_key(0), "k1")]}
        self.calls = 0
        self.gate: asyncio.Event | None = None
        self.fail = False

    async def __call__(self, uri: str, limit: float) -> bytes:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise FetchError("HTTP 503")
        return json.dumps(self.document).encode()


async def test_kid_miss_refetch_is_rate_limited_with_fake_fetcher_and_clock() -> None:
    idp, now = FakeIdP(), [1000.0]
    remote = RemoteJwks(
        JwksUriConfig("http://idp/jwks", min_refetch_seconds=10), fetch=idp, clock=lambda: now[0]
    )
    assert await remote.refresh("initial")
    assert remote.version == 1
    first = remote.request_refetch()
    assert first is not None
    assert await first
    assert idp.calls == 2
    assert remote.request_refetch() is None  # within 10 s
    now[0] += 9.9
    assert remote.request_refetch() is None
    now[0] += 0.2
    again = remote.request_refetch()
    assert again is not None and await again
    assert idp.calls == 3
    assert remote.version == 1  # same keys: the token cache is kept


async def test_concurrent_requests_share_one_inflight_fetch_with_fake_fetcher() -> None:
    idp = FakeIdP()
    idp.gate = asyncio.Event()
    remote = RemoteJwks(JwksUriConfig("http://idp/jwks", min_refetch_seconds=60), fetch=idp)
    first = remote.request_refetch()
    second = remote.request_refetch()  # in flight: joined, not rate-limited away
    assert first is not None and second is first
    idp.document = {"keys": [public_jwk(ec_key(1), "k2")]}
    idp.gate.set()
    assert await first
    assert idp.calls == 1
    assert [k.kid for k in remote.keys.keys] == ["k2"]


async def test_failures_keep_the_last_good_set_with_fake_fetcher() -> None:
    idp = FakeIdP()
    remote = RemoteJwks(JwksUriConfig("http://idp/jwks"), fetch=idp)
    assert await remote.refresh()
    good = remote.keys
    broken_documents: list[object] = [
        {"keys": []},
        {"nokeys": 1},
        [1, 2],
        {"keys": [{"kty": "EC", "crv": "P-999"}]},
    ]
    for broken in broken_documents:
        idp.document = broken
        assert not await remote.refresh()
        assert remote.keys is good
    idp.fail = True
    assert not await remote.refresh()
    assert remote.keys is good and remote.version == 1
