"""The OIDC endpoints of a real mgmt-api subprocess against the real test provider.

The provider is the npm ``oidc-provider`` (tests/support/oidc_provider); the
"browser" is an HTTP client that follows the provider's redirects and logs
in through its browser-less interaction route. Every token checked here is
used against the API afterwards, so "a session was created" means the
server accepts it.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Iterator
from urllib.parse import parse_qs, urljoin, urlsplit

import httpx
import pytest

from mgmt_api.identity.device_code import poll_for_tokens, start_device_authorization
from mgmt_api.identity.token_exchange import V1_REFUSAL
from tests.identity.browser import approve_device, follow_until
from tests.identity.install_config import oidc_section, write_install_config
from tests.identity.provider_tokens import client_credentials_token
from tests.mgmt_api.harness import MgmtServer, err, ok, unique
from tests.support.oidc_provider.launcher import (
    API_V1,
    API_V2,
    DEVICE_CLIENT_ID,
    EXCHANGE_CLIENT_ID,
    EXCHANGE_CLIENT_SECRET,
    OTHER_CLIENT_ID,
    OTHER_CLIENT_SECRET,
    WEB_CLIENT_ID,
    RunningProvider,
    start_provider,
)

LOOPBACK = "http://127.0.0.1:9/callback?state=client-state"  # never requested: only parsed
TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN = "urn:ietf:params:oauth:token-type:access_token"
ID_TOKEN = "urn:ietf:params:oauth:token-type:id_token"


@pytest.fixture(scope="module")
def provider_and_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[RunningProvider, MgmtServer]]:
    directory = tmp_path_factory.mktemp("oidc-routes")
    server = MgmtServer()
    callback = f"{server.url}/v2/oidc/callback"
    provider = start_provider([callback], directory / "provider.log")
    try:
        config = write_install_config(directory, oidc_section(directory, provider, callback))
        server.install_config = str(config)
        server.start()
        try:
            yield provider, server
        finally:
            server.close()
    finally:
        provider.stop()


@pytest.fixture(scope="module")
def server(provider_and_server: tuple[RunningProvider, MgmtServer]) -> MgmtServer:
    return provider_and_server[1]


@pytest.fixture(scope="module")
def provider(provider_and_server: tuple[RunningProvider, MgmtServer]) -> RunningProvider:
    return provider_and_server[0]


@pytest.fixture(scope="module")
def alice_org(server: MgmtServer) -> str:
    """``organizations/ORG/users/alice`` (the provider's account), a reader through her team."""
    org = unique("idp")
    with server.admin() as admin:
        ok(admin.post("/v2/organizations", json={"name": org, "organization": {}}))
        ok(admin.post(f"/v2/organizations/{org}/users", json={"name": "alice", "user": {}}))
        team = {"members": [f"organizations/{org}/users/alice"]}
        ok(admin.post(f"/v2/organizations/{org}/teams", json={"name": "readers", "team": team}))
        policy = ok(admin.get(f"/v2/organizations/{org}/policy"))
        policy["allow"].append(
            {"role": "rbac/reader", "subjects": [{"team": f"organizations/{org}/teams/readers"}]}
        )
        ok(admin.put(f"/v2/organizations/{org}/policy", json=policy))
    return org


@pytest.fixture
async def browser() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10.0) as client:
        yield client


async def provider_callback(
    browser: httpx.AsyncClient, server: MgmtServer, query: str = "", account: str = "alice"
) -> str:
    """Start the login at the server and log ``account`` in at the provider; return the
    callback URL the provider sends the browser to (not yet requested)."""
    start = await browser.get(f"{server.url}/v2/oidc/login{query}")
    assert start.status_code == 302, start.text
    assert "meshplane_login" in start.cookies
    authorize = start.headers["location"]
    params = parse_qs(urlsplit(authorize).query)
    assert params["code_challenge_method"] == ["S256"] and params["nonce"] and params["state"]
    assert params["client_id"] == [WEB_CLIENT_ID]
    interaction = await follow_until(browser, authorize, urljoin(authorize, "/interaction/"))
    return await follow_until(
        browser, f"{interaction}?account={account}", f"{server.url}/v2/oidc/callback"
    )


def query_of(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}


def claims_of(token: str) -> dict[str, object]:
    payload = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


# ---- configuration -----------------------------------------------------------------------------


def test_configuration_is_public_and_enough_to_start_any_login(
    server: MgmtServer, provider: RunningProvider
) -> None:
    with server.client() as anonymous:
        body = ok(anonymous.get("/v2/oidc/configuration"))
    assert body["enabled"] is True and body["issuer"] == provider.issuer
    assert (body["clientId"], body["loginUrl"]) == (WEB_CLIENT_ID, "/v2/oidc/login")
    assert body["deviceCodeSupported"] and body["deviceCodeClientId"] == DEVICE_CLIENT_ID
    assert body["tokenExchangeSupported"] and body["tokenExchangeClientId"] == EXCHANGE_CLIENT_ID
    assert body["deviceAuthorizationEndpoint"].startswith(provider.issuer)
    assert [c["name"] for c in body["configurations"]] == ["corp"]
    assert "secret" not in json.dumps(body).lower()


# ---- authorization-code login ------------------------------------------------------------------


async def test_browser_less_login_redirects_with_a_session_token_that_follows_teams(
    server: MgmtServer, alice_org: str, browser: httpx.AsyncClient
) -> None:
    callback = await provider_callback(browser, server, f"?redirectUri={LOOPBACK}")
    finished = await browser.get(callback)
    assert finished.status_code == 302, finished.text
    target = finished.headers["location"]
    assert target.startswith(LOOPBACK + "&")  # redirectUri exactly as given, query kept
    result = query_of(target)
    assert result["state"] == "client-state" and int(result["expiresIn"]) > 0
    bearer = {"Authorization": f"Bearer {result['accessToken']}"}
    with server.client(headers=bearer) as alice:
        ok(alice.get(f"/v2/organizations/{alice_org}"))  # rbac/reader through team readers
        err(alice.put(f"/v2/organizations/{alice_org}", json={"etag": "x"}), 403)
    assert claims_of(result["accessToken"])["sub"] == f"organizations/{alice_org}/users/alice"


async def test_named_login_without_redirect_uri_answers_the_token_as_json(
    server: MgmtServer, alice_org: str, browser: httpx.AsyncClient
) -> None:
    start = await browser.get(f"{server.url}/v2/oidc/corp/login")
    assert start.status_code == 302
    interaction = await follow_until(
        browser, start.headers["location"], urljoin(start.headers["location"], "/interaction/")
    )
    callback = await follow_until(browser, interaction, f"{server.url}/v2/oidc/callback")
    body = ok(await browser.get(callback))
    assert body["subject"] == f"organizations/{alice_org}/users/alice"
    assert body["tokenType"] == "Bearer" and body["expiresIn"] > 0


async def test_a_replayed_callback_is_refused_and_creates_no_session(
    server: MgmtServer, alice_org: str, browser: httpx.AsyncClient
) -> None:
    callback = await provider_callback(browser, server)
    ok(await browser.get(callback))
    browser.cookies.set("meshplane_login", "any", path="/v2/oidc")
    replay = await browser.get(callback)
    assert replay.status_code == 400 and replay.headers["content-type"].startswith("text/html")
    assert "expired or was already used" in replay.text and "accessToken" not in replay.text


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("?state=forged-state&code=forged-code", "expired or was already used"),
        ("?code=some-code", "no state parameter"),
    ],
    ids=["forged-state", "missing-state"],
)
async def test_a_forged_or_missing_state_gets_the_generic_page(
    server: MgmtServer, browser: httpx.AsyncClient, query: str, message: str
) -> None:
    page = await browser.get(f"{server.url}/v2/oidc/callback{query}&error=x&errorDescription=EVIL")
    assert page.status_code == 400 and message in page.text
    assert "EVIL" not in page.text  # a crafted link cannot put text on our pages


async def test_a_state_completed_in_another_browser_is_refused_and_burnt(
    server: MgmtServer, alice_org: str, browser: httpx.AsyncClient
) -> None:
    callback = await provider_callback(browser, server, f"?redirectUri={LOOPBACK}")
    async with httpx.AsyncClient(timeout=10.0) as attacker:
        stolen = await attacker.get(callback)
    assert stolen.status_code == 400 and "another browser" in stolen.text
    again = await browser.get(callback)  # the state was consumed by the refused attempt
    assert again.status_code == 400 and "expired or was already used" in again.text


async def test_the_provider_error_callback_is_shown_escaped_without_a_session(
    server: MgmtServer, browser: httpx.AsyncClient
) -> None:
    callback = await provider_callback(browser, server, account="deny")
    assert query_of(callback)["error"] == "access_denied"
    page = await browser.get(callback)
    assert page.status_code == 400 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert "access_denied" in page.text and "<script" not in page.text.lower()
    assert "&lt;" in page.text  # the provider's description holds HTML; it is escaped


async def test_a_failed_login_goes_back_to_the_client_with_the_reason(
    server: MgmtServer, browser: httpx.AsyncClient
) -> None:
    denied = await browser.get(
        await provider_callback(browser, server, f"?redirectUri={LOOPBACK}", account="deny")
    )
    assert denied.status_code == 302
    assert query_of(denied.headers["location"])["error"] == "access_denied"
    unknown = await browser.get(
        await provider_callback(browser, server, f"?redirectUri={LOOPBACK}", account="bob")
    )
    result = query_of(unknown.headers["location"])
    assert result["error"] == "unknown_user" and "accessToken" not in result
    assert "ask an administrator" in result["errorDescription"]


async def test_an_open_redirect_target_is_refused_before_the_provider(
    server: MgmtServer, browser: httpx.AsyncClient
) -> None:
    response = await browser.get(
        f"{server.url}/v2/oidc/login", params={"redirectUri": "https://evil.example/x"}
    )
    body = err(response, 400)
    assert body["details"][0]["metadata"]["reason"] == "invalid_redirect_uri"
    err(await browser.get(f"{server.url}/v2/oidc/nobody/login"), 404)


async def test_a_login_started_before_a_restart_completes_after_it(
    server: MgmtServer, alice_org: str, browser: httpx.AsyncClient
) -> None:
    """Pending logins live in the database, so any replica (or a restarted one) completes them."""
    callback = await provider_callback(browser, server)
    await asyncio.to_thread(server.stop)
    await asyncio.to_thread(server.start)
    body = ok(await browser.get(callback))
    assert body["subject"] == f"organizations/{alice_org}/users/alice"


# ---- device code and token exchange (POST /v2/oidc/token) ---------------------------------------


async def device_id_token(provider: RunningProvider, account: str) -> str:
    """What ``meshctl login --use-device-code`` obtains: the provider's ID token."""
    async with httpx.AsyncClient(timeout=10.0) as http:
        discovery = (await http.get(provider.configuration_uri)).json()
        authorization = await start_device_authorization(
            http, discovery["device_authorization_endpoint"], DEVICE_CLIENT_ID
        )
        async with httpx.AsyncClient(timeout=10.0) as user_browser:
            await approve_device(
                user_browser, authorization.verification_uri_complete or "", account
            )

        async def no_wait(_seconds: float) -> None:
            """Approved already: the first poll gets the tokens."""

        tokens = await poll_for_tokens(
            http, discovery["token_endpoint"], DEVICE_CLIENT_ID, authorization, sleep=no_wait
        )
    assert tokens.id_token is not None
    return tokens.id_token


async def test_device_code_id_token_is_exchanged_for_a_session(
    server: MgmtServer, provider: RunningProvider, alice_org: str
) -> None:
    id_token = await device_id_token(provider, "alice")
    form = {
        "grant_type": TOKEN_EXCHANGE,
        "subject_token": id_token,
        "subject_token_type": ID_TOKEN,
        "requested_token_type": ACCESS_TOKEN,
        "organization": alice_org,
        "tenant": "ignored",
    }
    with server.client() as anonymous:
        body = ok(anonymous.post("/v2/oidc/token", data=form))
    assert body["token_type"] == "Bearer" and body["issued_token_type"] == ACCESS_TOKEN
    with server.client(headers={"Authorization": f"Bearer {body['access_token']}"}) as alice:
        ok(alice.get(f"/v2/organizations/{alice_org}"))

    bob = await device_id_token(provider, "bob")
    with server.client() as anonymous:
        refused = err(anonymous.post("/v2/oidc/token", data={**form, "subject_token": bob}), 401)
    assert refused["details"][0]["metadata"]["reason"] == "unknown_user"


async def provider_access_token(
    provider: RunningProvider, client_id: str, secret: str, resource: str
) -> str:
    return await asyncio.to_thread(client_credentials_token, provider, client_id, secret, resource)


def exchange(server: MgmtServer, subject_token: str) -> httpx.Response:
    with server.client() as anonymous:
        return anonymous.post(
            "/v2/oidc/token",
            data={
                "grant_type": TOKEN_EXCHANGE,
                "subject_token": subject_token,
                "subject_token_type": ACCESS_TOKEN,
            },
        )


async def test_token_exchange_needs_the_user_record_of_the_subject(
    server: MgmtServer, provider: RunningProvider
) -> None:
    token = await provider_access_token(
        provider, EXCHANGE_CLIENT_ID, EXCHANGE_CLIENT_SECRET, API_V2
    )
    missing = err(exchange(server, token), 401)
    assert missing["details"][0]["metadata"]["reason"] == "unknown_user"
    assert EXCHANGE_CLIENT_ID in missing["message"]  # names the ID to create
    with server.admin() as admin:
        ok(admin.post("/v2/users", json={"name": EXCHANGE_CLIENT_ID, "user": {}}))
    try:
        body = ok(exchange(server, token))
        assert body["expires_in"] > 0
        bearer = {"Authorization": f"Bearer {body['access_token']}"}
        with server.client(headers=bearer) as robot:
            ok(robot.get(f"/v2/users/{EXCHANGE_CLIENT_ID}/permissions"))
    finally:
        with server.admin() as admin:
            ok(admin.delete(f"/v2/users/{EXCHANGE_CLIENT_ID}"))


async def test_token_exchange_refuses_other_clients_and_version_1_tokens(
    server: MgmtServer, provider: RunningProvider
) -> None:
    other = await provider_access_token(provider, OTHER_CLIENT_ID, OTHER_CLIENT_SECRET, API_V2)
    body = err(exchange(server, other), 403)
    assert body["details"][0]["metadata"]["reason"] == "client_not_allowed"
    v1 = await provider_access_token(provider, EXCHANGE_CLIENT_ID, EXCHANGE_CLIENT_SECRET, API_V1)
    body = err(exchange(server, v1), 401)
    assert body["message"] == V1_REFUSAL
    assert body["details"][0]["metadata"]["reason"] == "token_version_1"
    assert v1 not in json.dumps(body)


def test_a_malformed_token_request_is_invalid_argument(server: MgmtServer) -> None:
    with server.client() as anonymous:
        body = err(anonymous.post("/v2/oidc/token", data={"grant_type": TOKEN_EXCHANGE}), 400)
        assert body["details"][0]["metadata"]["reason"] == "invalid_request"
        body = err(anonymous.post("/v2/oidc/token", data={"grant_type": "password"}), 400)
        assert body["details"][0]["metadata"]["reason"] == "unsupported_grant_type"


def test_openapi_marks_the_oidc_endpoints_public(server: MgmtServer) -> None:
    with server.admin() as admin:
        paths = ok(admin.get("/v2/openapi.json"))["paths"]
    for path in ("/v2/oidc/login", "/v2/oidc/{name}/callback", "/v2/oidc/token"):
        for operation in paths[path].values():
            assert operation.get("security") in (None, []), (path, operation.get("security"))
    assert paths["/v2/organizations/{organization}:sync"]["post"]["security"]
