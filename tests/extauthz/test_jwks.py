"""Remote JWKS through a real HTTP key server: rotation, kid-miss refetch, outage."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

from extauthz.reasons import Reason
from meshplane.metrics import render_latest

from .jwtkit import claims, ec_key, make_token, public_jwk, rsa_key
from .keyserver import KeyServer
from .metricsutil import sample
from .support import GrpcClient, ServerThread, app_factory, check_request


def write_config(tmp_path: Path, keys: KeyServer) -> Path:
    path = tmp_path / "jwks-policies.yaml"
    path.write_text(
        f"""
defaultPolicy: rot
policies:
  - name: rot
    jwt:
      algorithms: [ES256]
      keys:
        - jwks:
            uri: {keys.url("/a")}
            cacheSeconds: 3600
            minRefetchSeconds: 3600
            kidMissWaitSeconds: 2
            timeoutSeconds: 2
  - name: flaky
    jwt:
      algorithms: [RS256]
      keys:
        - jwks: {{uri: "{keys.url("/b")}", cacheSeconds: 1, timeoutSeconds: 1}}
"""
    )
    return path


def es_token(index: int, kid: str) -> str:
    return make_token(
        claims(time.time(), path=None), alg="ES256", key=ec_key(index), header={"kid": kid}
    )


def rs_token(index: int, kid: str) -> str:
    return make_token(
        claims(time.time(), path=None), alg="RS256", key=rsa_key(index), header={"kid": kid}
    )


def reason_of(client: GrpcClient, token: str, policy: str) -> str:
    response = client.check(
        check_request("/x", {"authorization": f"Bearer {token}"}, policy=policy)
    )
    if response.status.code == 0:
        return Reason.OK.value
    return str(response.status.message)


def wait_until(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.05)


def test_rotation_refetches_once_on_unknown_kid(tmp_path: Path) -> None:
    with KeyServer() as keys:
        keys.documents["/a"] = {"keys": [public_jwk(ec_key(0), "k1")]}
        keys.documents["/b"] = {"keys": [public_jwk(rsa_key(0), "r1")]}
        with ServerThread(app_factory(write_config(tmp_path, keys))) as server:
            client = GrpcClient(server.port)
            assert keys.hits["/a"] == 1  # fetched once before serving
            before = sample(
                render_latest().decode(),
                "meshplane_extauthz_key_refreshes_total",
                trigger="kid_miss",
                result="success",
            )
            for _ in range(20):
                assert reason_of(client, es_token(0, "k1"), "rot") == "ok"
            assert keys.hits["/a"] == 1  # no network I/O on the hot path

            # The IdP rotates to k2 and drops k1. The first k2 request waits
            # for the kid-miss refetch and is allowed.
            keys.documents["/a"] = {"keys": [public_jwk(ec_key(1), "k2")]}
            assert reason_of(client, es_token(1, "k2"), "rot") == "ok"
            assert keys.hits["/a"] == 2
            # k1 is gone: its cached verdict was dropped with the old key set.
            assert reason_of(client, es_token(0, "k1"), "rot") == Reason.UNKNOWN_KID.value
            # A flood of random kids cannot make us hammer the IdP.
            for _ in range(10):
                assert reason_of(client, es_token(0, uuid.uuid4().hex), "rot") == "unknown_kid"
            assert keys.hits["/a"] == 2
            after = sample(
                render_latest().decode(),
                "meshplane_extauthz_key_refreshes_total",
                trigger="kid_miss",
                result="success",
            )
            assert after == before + 1
            client.close()


def test_outage_keeps_last_good_keys(tmp_path: Path) -> None:
    with KeyServer() as keys:
        keys.documents["/a"] = {"keys": [public_jwk(ec_key(0), "k1")]}
        keys.documents["/b"] = {"keys": [public_jwk(rsa_key(0), "r1")]}
        with ServerThread(app_factory(write_config(tmp_path, keys))) as server:
            client = GrpcClient(server.port)
            assert reason_of(client, rs_token(0, "r1"), "flaky") == "ok"
            errors_before = sample(
                render_latest().decode(),
                "meshplane_extauthz_key_refreshes_total",
                trigger="ttl",
                result="error",
            )
            for failure in ("http-503", "not-json", "empty-set"):
                if failure == "http-503":
                    keys.status["/b"] = 503
                elif failure == "not-json":
                    keys.status["/b"] = 200
                    keys.documents["/b"] = None
                else:
                    keys.documents["/b"] = {"keys": []}
                target = keys.hits["/b"] + 2
                wait_until(lambda: keys.hits["/b"] >= target)  # noqa: B023 - used at once
                assert reason_of(client, rs_token(0, "r1"), "flaky") == "ok", failure
            errors_after = sample(
                render_latest().decode(),
                "meshplane_extauthz_key_refreshes_total",
                trigger="ttl",
                result="error",
            )
            assert errors_after >= errors_before + 3
            # Recovery with a rotated key: picked up by the TTL refresh.
            keys.documents["/b"] = {"keys": [public_jwk(rsa_key(1), "r2")]}
            wait_until(lambda: reason_of(client, rs_token(1, "r2"), "flaky") == "ok")
            assert reason_of(client, rs_token(0, "r1"), "flaky") == "unknown_kid"
            client.close()


def test_idp_down_at_start_then_first_request_recovers(tmp_path: Path) -> None:
    with KeyServer() as keys:
        keys.status["/a"] = 503
        keys.documents["/b"] = {"keys": [public_jwk(rsa_key(0), "r1")]}
        with ServerThread(app_factory(write_config(tmp_path, keys))) as server:
            client = GrpcClient(server.port)
            # Asked at start; on a loaded machine the refresher's first retry
            # (backoff from 1 s) may have asked again before this line.
            assert keys.hits["/a"] >= 1
            keys.status["/a"] = 200
            keys.documents["/a"] = {"keys": [public_jwk(ec_key(0), "k1")]}
            # No keys yet: the request triggers the (rate-limited) refetch and waits for it.
            assert reason_of(client, es_token(0, "k1"), "rot") == "ok"
            client.close()


def test_kid_miss_wait_is_bounded_by_kid_miss_wait_seconds(tmp_path: Path) -> None:
    with KeyServer() as keys:
        keys.documents["/a"] = {"keys": [public_jwk(ec_key(0), "k1")]}
        keys.documents["/b"] = {"keys": [public_jwk(rsa_key(0), "r1")]}
        config = write_config(tmp_path, keys)
        config.write_text(
            config.read_text().replace("kidMissWaitSeconds: 2", "kidMissWaitSeconds: 0.2")
        )
        with ServerThread(app_factory(config)) as server:
            client = GrpcClient(server.port)
            # The IdP rotates but answers slowly: the request gives up waiting
            # after 0.2 s and is denied; had it waited for the fetch, it would
            # have been allowed.
            keys.delay["/a"] = 1.0
            keys.documents["/a"] = {"keys": [public_jwk(ec_key(1), "k2")]}
            assert reason_of(client, es_token(1, "k2"), "rot") == Reason.UNKNOWN_KID.value
            # The fetch still completes in the background and serves later requests.
            wait_until(lambda: reason_of(client, es_token(1, "k2"), "rot") == "ok")
            client.close()
