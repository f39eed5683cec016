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
import hashlib
import json
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from http.cookies import SimpleCookie
from urllib.parse import parse_qs, urljoin, urlsplit

import httpx
import pytest

from meshctl.oauth import poll_for_tokens, start_device_authorization
from meshctl.transport import Transport
from mgmt_api.identity.pkce import code_challenge_s256, new_code_verifier
from mgmt_api.identity.token_exchange import V1_REFUSAL
from mgmt_api.identity.user_mapping import BINDING_LABEL
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
# The organization whose LDAP users the "corp" configuration logs in (users.organizations).
SYNCED_ORG = unique("synced")
# A second configuration behind a TLS-terminating proxy that serves the API under /iam.
PROXIED_CALLBACK = "https://mp.example.test:8443/iam/v2/oidc/proxied/callback"
BOUND = {"labels": {BINDING_LABEL: "corp"}}


@pytest.fixture(scope="module")
def provider_and_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[RunningProvider, MgmtServer]]:
    directory = tmp_path_factory.mktemp("oidc-routes")
    server = MgmtServer()
    callback = f"{server.url}/v2/oidc/callback"
    provider = start_provider([callback], directory / "provider.log")
    try:
        users = f"users: {{sourceTypes: [LDAP], organizations: [{SYNCED_ORG}]}}\n"
        proxied = textwrap.dedent(
            f"""\
            - name: proxied
              clientId: {WEB_CLIENT_ID}
              clientSecret: {{file: {directory / "client-secret"}}}
              providerConfig: {{dynamic: {{configurationUri: {provider.configuration_uri}}}}}
              redirectUri: {PROXIED_CALLBACK}
            """
        )
        section = oidc_section(directory, provider, callback, extra=users) + textwrap.indent(
            proxied, "  "
        )
        config = write_install_config(directory, section)
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
    """``organizations/ORG/users/alice`` (the provider's account), bound to the "corp"
    configuration by label, a reader through her team."""
    org = unique("idp")
    with server.admin() as admin:
        ok(admin.post("/v2/organizations", json={"name": org, "organization": {}}))
        ok(admin.post(f"/v2/organizations/{org}/users", json={"name": "alice", "user": BOUND}))
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


def loopback_login(redirect_uri: str = LOOPBACK) -> tuple[dict[str, str], str]:
    """The query of a native client's login (RFC 8252) and the PKCE verifier it keeps."""
    verifier = new_code_verifier()
    query = {
        "redirectUri": redirect_uri,
        "codeChallenge": code_challenge_s256(verifier),
        "codeChallengeMethod": "S256",
    }
    return query, verifier


async def provider_callback(
    browser: httpx.AsyncClient,
    server: MgmtServer,
    params: dict[str, str] | None = None,
    account: str = "alice",
) -> str:
    """Start the login at the server and log ``account`` in at the provider; return the
    callback URL the provider sends the browser to (not yet requested)."""
    start = await browser.get(f"{server.url}/v2/oidc/login", params=params)
    assert start.status_code == 302, start.text
    assert "meshplane_login" in start.cookies
    authorize = start.headers["location"]
    query = parse_qs(urlsplit(authorize).query)
    assert query["code_challenge_method"] == ["S256"] and query["nonce"] and query["state"]
    assert query["client_id"] == [WEB_CLIENT_ID]
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
    assert [c["name"] for c in body["configurations"]] == ["corp", "proxied"]
    assert body["configurations"][1]["callbackUrl"] == "/v2/oidc/proxied/callback"
    assert "secret" not in json.dumps(body).lower()


# ---- authorization-code login ------------------------------------------------------------------


def redeem(server: MgmtServer, form: dict[str, str]) -> httpx.Response:
    with server.client() as anonymous:
        return anonymous.post("/v2/oidc/token", data={"grant_type": "authorization_code", **form})


async def test_loopback_login_gets_a_one_time_code_redeemed_with_the_clients_verifier(
    server: MgmtServer, alice_org: str, browser: httpx.AsyncClient
) -> None:
    """RFC 8252: no token in the loopback URL; the code needs the client's PKCE verifier,
    works once, and the token it yields is alice's session, following her teams."""
    query, verifier = loopback_login()
    finished = await browser.get(await provider_callback(browser, server, query))
    assert finished.status_code == 302, finished.text
    target = finished.headers["location"]
    assert target.startswith(LOOPBACK + "&")  # redirectUri exactly as given, query kept
    result = query_of(target)
    assert set(result) == {"state", "code"} and result["state"] == "client-state"

    body = ok(redeem(server, {"code": result["code"], "code_verifier": verifier,
                              "redirect_uri": LOOPBACK}))  # fmt: skip
    assert body["token_type"] == "Bearer" and 0 < body["expires_in"] <= 3600
    bearer = {"Authorization": f"Bearer {body['access_token']}"}
    with server.client(headers=bearer) as alice:
        ok(alice.get(f"/v2/organizations/{alice_org}"))  # rbac/reader through team readers
        err(alice.put(f"/v2/organizations/{alice_org}", json={"etag": "x"}), 403)
    assert claims_of(body["access_token"])["sub"] == f"organizations/{alice_org}/users/alice"

    again = err(redeem(server, {"code": result["code"], "code_verifier": verifier}), 400)
    assert again["details"][0]["metadata"]["reason"] == "invalid_grant"


async def test_a_login_code_is_refused_with_a_wrong_verifier_and_then_burnt(
    server: MgmtServer, alice_org: str, browser: httpx.AsyncClient
) -> None:
    query, verifier = loopback_login()
    finished = await browser.get(await provider_callback(browser, server, query))
    code = query_of(finished.headers["location"])["code"]
    wrong = err(redeem(server, {"code": code, "code_verifier": new_code_verifier()}), 400)
    assert wrong["details"][0]["metadata"]["reason"] == "invalid_grant"
    assert "access_token" not in json.dumps(wrong)
    # One guess only: the right verifier no longer helps whoever made the wrong one.
    burnt = err(redeem(server, {"code": code, "code_verifier": verifier}), 400)
    assert burnt["details"][0]["metadata"]["reason"] == "invalid_grant"


async def test_a_login_code_needs_the_same_redirect_uri_and_the_verifier(
    server: MgmtServer, alice_org: str, browser: httpx.AsyncClient
) -> None:
    query, verifier = loopback_login()
    finished = await browser.get(await provider_callback(browser, server, query))
    code = query_of(finished.headers["location"])["code"]
    missing = err(redeem(server, {"code": code}), 400)
    assert missing["details"][0]["metadata"]["reason"] == "invalid_request"
    other = err(
        redeem(server, {"code": code, "code_verifier": verifier,
                        "redirect_uri": "http://127.0.0.1:10/callback"}),
        400,
    )  # fmt: skip
    assert other["details"][0]["metadata"]["reason"] == "invalid_grant"


@pytest.mark.parametrize(
    ("params", "reason"),
    [
        ({"redirectUri": LOOPBACK}, "code_challenge_required"),
        ({"redirectUri": LOOPBACK, "codeChallenge": "x" * 43, "codeChallengeMethod": "plain"},
         "invalid_code_challenge"),
        ({"redirectUri": "http://localhost:9/callback", "codeChallenge": "x" * 43,
          "codeChallengeMethod": "S256"}, "invalid_redirect_uri"),
    ],
    ids=["no-challenge", "plain", "localhost"],
)  # fmt: skip
async def test_a_loopback_login_needs_pkce_and_a_literal_loopback_ip(
    server: MgmtServer, browser: httpx.AsyncClient, params: dict[str, str], reason: str
) -> None:
    body = err(await browser.get(f"{server.url}/v2/oidc/login", params=params), 400)
    assert body["details"][0]["metadata"]["reason"] == reason


def set_cookies(response: httpx.Response) -> SimpleCookie:
    jar: SimpleCookie = SimpleCookie()
    for header in response.headers.get_list("set-cookie"):
        jar.load(header)
    return jar


async def test_the_login_cookie_follows_the_configured_public_callback(
    server: MgmtServer, browser: httpx.AsyncClient
) -> None:
    """Path and Secure come from redirectUri: behind a proxy serving /iam with TLS ending
    there, the request is plain http on /v2/oidc, yet the browser calls back on
    https://.../iam/v2/oidc/proxied/callback and must send the cookie there."""
    direct = set_cookies(await browser.get(f"{server.url}/v2/oidc/login"))["meshplane_login"]
    assert direct["path"] == "/v2/oidc/callback" and not direct["secure"]
    assert direct["httponly"] and direct["samesite"].lower() == "lax"
    proxied = set_cookies(await browser.get(f"{server.url}/v2/oidc/proxied/login"))
    cookie = proxied["meshplane_login"]
    assert cookie["path"] == "/iam/v2/oidc/proxied/callback" and cookie["secure"]
    assert cookie.value != direct.value and len(cookie.value) >= 43


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
    browser.cookies.set("meshplane_login", "any", path="/v2/oidc/callback")
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


@pytest.mark.parametrize(
    "attacker_cookie",
    [
        lambda state: hashlib.sha256(("meshplane-login:" + state).encode()).hexdigest(),
        lambda state: "a-wrong-cookie",
        lambda state: None,
    ],
    ids=["old-scheme-digest-of-state", "wrong-cookie", "no-cookie"],
)
async def test_a_captured_callback_cannot_be_completed_in_another_browser(
    server: MgmtServer, alice_org: str, browser: httpx.AsyncClient, attacker_cookie: object
) -> None:
    """Whoever captures the callback URL knows ``state``; the cookie used to be computable
    from it. Every cookie the attacker can produce is refused, and the state is burnt."""
    query, _ = loopback_login()
    callback = await provider_callback(browser, server, query)
    assert callable(attacker_cookie)
    cookie = attacker_cookie(query_of(callback)["state"])
    async with httpx.AsyncClient(timeout=10.0) as attacker:
        if cookie is not None:
            attacker.cookies.set("meshplane_login", cookie, path="/v2/oidc/callback")
        stolen = await attacker.get(callback)
    assert stolen.status_code == 400 and "another browser" in stolen.text
    assert "code=" not in stolen.headers.get("location", "")
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
        await provider_callback(browser, server, loopback_login()[0], account="deny")
    )
    assert denied.status_code == 302
    assert query_of(denied.headers["location"])["error"] == "access_denied"
    unknown = await browser.get(
        await provider_callback(browser, server, loopback_login()[0], account="bob")
    )
    result = query_of(unknown.headers["location"])
    assert result["error"] == "unknown_user" and "code" not in result
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
    """What ``meshctl login --use-device-code`` obtains: the provider's ID token (with
    meshctl's own client code, the one implementation of the device flow)."""
    async with httpx.AsyncClient(timeout=10.0) as http:
        discovery = (await http.get(provider.configuration_uri)).json()
    transport = Transport(timeout=10.0)
    authorization = await asyncio.to_thread(
        start_device_authorization,
        transport,
        discovery["device_authorization_endpoint"],
        DEVICE_CLIENT_ID,
        ["openid", "email", "profile"],
    )
    async with httpx.AsyncClient(timeout=10.0) as user_browser:
        await approve_device(user_browser, authorization.verification_uri_complete or "", account)

    def no_wait(_seconds: float) -> None:
        """Approved already: the first poll gets the tokens."""

    tokens = await asyncio.to_thread(
        poll_for_tokens,
        transport,
        discovery["token_endpoint"],
        DEVICE_CLIENT_ID,
        authorization,
        sleep=no_wait,
    )
    assert tokens.id_token is not None
    return tokens.id_token


def device_form(id_token: str, organization: str) -> dict[str, str]:
    return {
        "grant_type": TOKEN_EXCHANGE,
        "subject_token": id_token,
        "subject_token_type": ID_TOKEN,
        "requested_token_type": ACCESS_TOKEN,
        "organization": organization,
    }


async def test_device_code_id_token_is_exchanged_for_a_session(
    server: MgmtServer, provider: RunningProvider, alice_org: str
) -> None:
    id_token = await device_id_token(provider, "alice")
    form = device_form(id_token, alice_org)
    with server.client() as anonymous:
        body = ok(anonymous.post("/v2/oidc/token", data=form))
    assert body["token_type"] == "Bearer" and body["issued_token_type"] == ACCESS_TOKEN
    with server.client(headers={"Authorization": f"Bearer {body['access_token']}"}) as alice:
        ok(alice.get(f"/v2/organizations/{alice_org}"))

    bob = await device_id_token(provider, "bob")
    with server.client() as anonymous:
        refused = err(anonymous.post("/v2/oidc/token", data={**form, "subject_token": bob}), 401)
    assert refused["details"][0]["metadata"]["reason"] == "unknown_user"


async def test_logins_map_only_to_users_of_this_configuration_never_local_ones(
    server: MgmtServer, provider: RunningProvider
) -> None:
    """The provider says ``sub=alice``. Local and unbound ``alice`` records must not match;
    a synced one in the configuration's organizations (users.organizations) does."""
    other = unique("other")
    with server.admin() as admin:
        for org in (other, SYNCED_ORG):
            ok(admin.post("/v2/organizations", json={"name": org, "organization": {}}))
        # An admin-made, unbound alice, and a global local-password alice.
        ok(admin.post(f"/v2/organizations/{other}/users", json={"name": "alice", "user": {}}))
        ok(admin.post("/v2/users", json={"name": "alice", "user": {"password": "pw-alice-42!"}}))
    try:
        with server.client() as anonymous:
            for org in (other, SYNCED_ORG):
                form = device_form(await device_id_token(provider, "alice"), org)
                refused = err(anonymous.post("/v2/oidc/token", data=form), 401)
                assert refused["details"][0]["metadata"]["reason"] == "unknown_user", org
        # The LDAP directory (pushed) brings alice and bob into both organizations; in
        # ``other`` the manual alice keeps her place (a directory user never takes over a
        # local one), so the push reports her as a failed addition.
        with server.admin() as admin:
            pushed = {"sourceType": "LDAP", "users": [{"id": "alice"}, {"id": "bob"}]}
            ok(admin.post(f"/v2/organizations/{SYNCED_ORG}:sync", json=pushed))
            partial = ok(admin.post(f"/v2/organizations/{other}:sync", json=pushed))
            assert partial["failedUsers"]["addition"] == ["alice"]
        with server.client() as anonymous:
            form = device_form(await device_id_token(provider, "alice"), SYNCED_ORG)
            body = ok(anonymous.post("/v2/oidc/token", data=form))
            subject = claims_of(body["access_token"])["sub"]
            assert subject == f"organizations/{SYNCED_ORG}/users/alice"
            # A synced bob outside the configuration's organizations is not its user.
            form = device_form(await device_id_token(provider, "bob"), other)
            refused = err(anonymous.post("/v2/oidc/token", data=form), 401)
            assert refused["details"][0]["metadata"]["reason"] == "unknown_user"
    finally:
        with server.admin() as admin:
            for org in (other, SYNCED_ORG):
                ok(admin.delete(f"/v2/organizations/{org}", params={"force": "true"}))
            ok(admin.delete("/v2/users/alice"))


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
        # Unbound, the record is not this configuration's: still unknown.
        unbound = err(exchange(server, token), 401)
        assert unbound["details"][0]["metadata"]["reason"] == "unknown_user"
        with server.admin() as admin:
            robot = ok(admin.get(f"/v2/users/{EXCHANGE_CLIENT_ID}"))
            ok(admin.put(f"/v2/users/{EXCHANGE_CLIENT_ID}", json={**robot, **BOUND}))
        body = ok(exchange(server, token))
        # Never longer than the provider token (the test provider's live 600 s).
        provider_exp = float(str(claims_of(token)["exp"]))
        assert 0 < body["expires_in"] <= provider_exp - time.time() + 1
        assert float(str(claims_of(body["access_token"])["exp"])) <= provider_exp + 1
        bearer = {"Authorization": f"Bearer {body['access_token']}"}
        with server.client(headers=bearer) as robot_client:
            ok(robot_client.get(f"/v2/users/{EXCHANGE_CLIENT_ID}/permissions"))
        replayed = err(exchange(server, token), 401)
        assert replayed["details"][0]["metadata"]["reason"] == "token_replayed"
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
