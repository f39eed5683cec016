"""JWKS caching: TTL, refetch on an unknown kid (spaced), last keys kept on failure.

Served by a tiny real HTTP server on loopback whose key set the test rotates.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from mgmt_api.identity.errors import InvalidTokenError, ProviderError
from mgmt_api.identity.jwks import JwksCache, verify_jwt


class KeyServer:
    def __init__(self) -> None:
        self.document: dict[str, Any] = {"keys": []}
        self.hits = 0
        self.status = 200
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                outer.hits += 1
                body = json.dumps(outer.document).encode()
                self.send_response(outer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/jwks"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def keys() -> Iterator[KeyServer]:
    server = KeyServer()
    yield server
    server.server.shutdown()
    server.server.server_close()


def new_key(kid: str) -> tuple[rsa.RSAPrivateKey, dict[str, Any]]:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(private.public_key()))
    return private, {**public, "kid": kid, "use": "sig", "alg": "RS256"}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_rotation_is_picked_up_on_unknown_kid_but_refetches_are_spaced(
    keys: KeyServer,
) -> None:
    k1, jwk1 = new_key("k1")
    k2, jwk2 = new_key("k2")
    keys.document = {"keys": [jwk1]}
    clock = Clock()
    async with httpx.AsyncClient() as http:
        cache = JwksCache(http, keys.url, ttl_s=3600, min_refetch_interval_s=30, clock=clock)
        t1 = jwt.encode({"sub": "a"}, k1, algorithm="RS256", headers={"kid": "k1"})
        assert (await verify_jwt(t1, cache))["sub"] == "a"
        assert keys.hits == 1
        keys.document = {"keys": [jwk1, jwk2]}
        t2 = jwt.encode({"sub": "b"}, k2, algorithm="RS256", headers={"kid": "k2"})
        clock.now = 10  # too soon after the last fetch: no refetch for an unknown kid
        with pytest.raises(InvalidTokenError, match="unknown key"):
            await verify_jwt(t2, cache)
        assert keys.hits == 1
        clock.now = 31
        assert (await verify_jwt(t2, cache))["sub"] == "b"
        assert keys.hits == 2
        await verify_jwt(t1, cache)  # known kid, fresh cache: no fetch
        assert keys.hits == 2


async def test_failed_refresh_keeps_the_last_keys(keys: KeyServer) -> None:
    k1, jwk1 = new_key("k1")
    keys.document = {"keys": [jwk1]}
    clock = Clock()
    async with httpx.AsyncClient() as http:
        cache = JwksCache(http, keys.url, ttl_s=60, clock=clock)
        token = jwt.encode({"sub": "a"}, k1, algorithm="RS256", headers={"kid": "k1"})
        await verify_jwt(token, cache)
        keys.status = 500
        clock.now = 120  # stale: refetch fails, old keys serve
        assert (await verify_jwt(token, cache))["sub"] == "a"
        fresh = JwksCache(http, keys.url)
        with pytest.raises(ProviderError):
            await verify_jwt(token, fresh)


async def test_algorithm_rules(keys: KeyServer) -> None:
    k1, jwk1 = new_key("k1")
    keys.document = {"keys": [jwk1, {"kty": "oct", "k": "c2VjcmV0", "kid": "hmac"}]}
    async with httpx.AsyncClient() as http:
        cache = JwksCache(http, keys.url)
        hs = jwt.encode({"sub": "a"}, "secret", algorithm="HS256", headers={"kid": "hmac"})
        with pytest.raises(InvalidTokenError) as refused:
            await verify_jwt(hs, cache)
        assert refused.value.reason == "alg_not_allowed"
        ps = jwt.encode({"sub": "a"}, k1, algorithm="PS256", headers={"kid": "k1"})
        with pytest.raises(InvalidTokenError) as mismatch:
            await verify_jwt(ps, cache)  # the JWK pins RS256
        assert mismatch.value.reason == "alg_mismatch"
        other = ec.generate_private_key(ec.SECP256R1())
        es = jwt.encode({"sub": "a"}, other, algorithm="ES256", headers={"kid": "k1"})
        with pytest.raises(InvalidTokenError):
            await verify_jwt(es, cache)
        with pytest.raises(InvalidTokenError) as malformed:
            await verify_jwt("not-a-jwt", cache)
        assert malformed.value.reason == "malformed"
