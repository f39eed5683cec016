"""Users (write-only passwords), service-account keys and JWKS, login throttling."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import httpx

from mgmt_api.auth.tokens import sign_service_account
from tests.mgmt_api.harness import MgmtServer, err, ok, unique


def test_password_is_write_only(server: MgmtServer, admin: httpx.Client, org: str) -> None:
    created = ok(
        admin.post(
            f"/v2/organizations/{org}/users",
            json={"name": "ann", "user": {"password": "first-password"}},
        )
    )
    assert "password" not in created and created["sourceType"] == "MANUAL"
    assert "password" not in ok(admin.get(f"/v2/organizations/{org}/users/ann"))
    with server.client(auth=(f"{org}/ann", "first-password")) as ann:
        err(ann.get(f"/v2/organizations/{org}"), 403)  # authenticated, but no grant
        ok(ann.get(f"/v2/organizations/{org}/users/ann/permissions"))
    user = ok(admin.get(f"/v2/organizations/{org}/users/ann"))
    ok(
        admin.put(
            f"/v2/organizations/{org}/users/ann", json={**user, "password": "second-password"}
        )
    )
    with server.client(auth=(f"{org}/ann", "first-password")) as ann:
        err(ann.get(f"/v2/organizations/{org}/users/ann/permissions"), 401)
    with server.client(auth=(f"{org}/ann", "second-password")) as ann:
        ok(ann.get(f"/v2/organizations/{org}/users/ann/permissions"))
    body = err(
        admin.post(
            f"/v2/organizations/{org}/users", json={"name": "short", "user": {"password": "x"}}
        ),
        400,
    )
    assert body["message"].startswith("user.password")
    ok(admin.delete(f"/v2/organizations/{org}/users/ann"))
    with server.client(auth=(f"{org}/ann", "second-password")) as ann:
        err(ann.get("/v2/oidc/configuration/../../organizations"), 401)


def test_service_account_keys_and_jwks(server: MgmtServer, admin: httpx.Client, org: str) -> None:
    base = f"/v2/organizations/{org}/serviceaccounts"
    created = ok(
        admin.post(base, json={"name": "bot", "serviceAccount": {}}, params={"keyEncoding": "JWK"})
    )
    key = created["keys"][0]
    private = json.loads(key["privateKey"])
    assert "d" in private and "d" not in json.loads(key["publicKey"])
    jwks = ok(admin.get(f"{base}/bot/jwks"))["keys"]
    assert [k["kid"] for k in jwks] == [key["id"]] and all("d" not in k for k in jwks)
    pem = ok(admin.get(f"{base}/bot"))["keys"][0]
    assert pem["publicKey"].startswith("-----BEGIN PUBLIC KEY-----") and "privateKey" not in pem

    token = sign_service_account(private, created["fqn"], time.time(), 300)
    with server.client(headers={"Authorization": f"Bearer {token}"}) as bot:
        perms = ok(bot.get(f"{base}/bot/permissions"))
        assert perms["rules"] == []
    new_key = ok(admin.post(f"{base}/bot/keys"))
    assert new_key["privateKey"].startswith("-----BEGIN PRIVATE KEY-----")
    ok(admin.delete(f"{base}/bot/keys/{key['id']}"))
    with server.client(headers={"Authorization": f"Bearer {token}"}) as bot:
        err(bot.get(f"{base}/bot/permissions"), 401)
    err(admin.delete(f"{base}/bot/keys/{key['id']}"), 404)


def _from(server: MgmtServer, address: str, auth: tuple[str, str]) -> httpx.Client:
    """A client whose connections come from ``address`` (any 127.x is loopback)."""
    transport = httpx.HTTPTransport(local_address=address)
    return server.client(auth=auth, transport=transport)


def test_wrong_passwords_lock_out_only_the_client_that_sent_them(
    server: MgmtServer, org: str, make_user: Callable[..., httpx.Client]
) -> None:
    """Throttling is keyed by login *and* client address: a client guessing the
    password of an account locks out itself, not the account's owner."""
    name = unique("u")
    make_user(org, name).close()
    login = f"{org}/{name}"
    with _from(server, "127.0.0.2", (login, "wrong-password")) as attacker:
        statuses = [attacker.get("/v2/organizations").status_code for _ in range(8)]
    assert 429 in statuses[5:]
    with _from(server, "127.0.0.2", (login, "user-password-1")) as same_client:
        err(same_client.post("/v2/auth/token"), 429, "RESOURCE_EXHAUSTED")
    with _from(server, "127.0.0.3", (login, "user-password-1")) as owner:
        assert ok(owner.post("/v2/auth/token"))["subject"] == f"organizations/{org}/users/{name}"


def test_repeated_failures_are_throttled(server: MgmtServer) -> None:
    login = f"{unique('org')}/nobody"
    statuses = []
    with server.client(auth=(login, "wrong-password")) as c:
        for _ in range(8):
            statuses.append(c.get("/v2/organizations").status_code)
    assert statuses[:5] == [401] * 5
    assert 429 in statuses[5:]
