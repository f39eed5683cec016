"""Browser, device-code and token-exchange logins.

Against the real management plane, which has no OIDC configured, each mode
must refuse in one clear line. The full flows run against the STAND-IN of
the not-yet-wired OIDC endpoints (``standin.py``); the device-code flow
talks RFC 8628 to the real test OIDC provider (npm ``oidc-provider``), and
every platform token handed out is a real one minted by the real server.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
from collections.abc import Iterator
from typing import IO
from urllib.parse import parse_qs, urljoin, urlsplit

import httpx
import pytest
import yaml

from tests.meshctl.conftest import ManagementPlane, Meshctl
from tests.meshctl.standin import StandIn
from tests.support.oidc_provider.launcher import (
    DEVICE_CLIENT_ID,
    RunningProvider,
    start_provider,
)

TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
V1_REFUSAL = (
    "this is a version 1.0 access token; token exchange accepts only version 2.0 access "
    "tokens: set accessTokenAcceptedVersion to 2 in the identity provider app's manifest"
)


@pytest.fixture
def standin() -> Iterator[StandIn]:
    server = StandIn().start()
    server.configuration = {
        "enabled": True,
        "name": "default",
        "loginUrl": "/v2/oidc/login",
        "deviceCodeSupported": False,
        "tokenExchangeSupported": True,
        "configurations": [],
    }
    yield server
    server.stop()


def stored_credentials(ctl: Meshctl) -> dict[str, str]:
    data = yaml.safe_load(ctl.config_file.read_text())
    creds: dict[str, str] = data["profiles"][data["currentProfile"]]["credentials"]
    return creds


@pytest.mark.parametrize(
    "mode",
    [[], ["--use-device-code", "--org", "o", "--tenant", "t"],
     ["--use-token-exchange", "--access-token", "abc.def.ghi"]],
    ids=["browser", "device-code", "token-exchange"],
)  # fmt: skip
def test_oidc_logins_refuse_clearly_when_the_real_server_has_no_oidc(
    meshctl: Meshctl, mode: list[str]
) -> None:
    line = meshctl.fails(3, "login", "--server", meshctl.server, "--no-browser", *mode)
    assert "OIDC login is not configured on this management plane" in line
    assert "--username" in line  # says what to do instead
    assert "abc.def.ghi" not in line


def read_until(stream: IO[str] | None, pattern: str) -> re.Match[str]:
    assert stream is not None
    for _ in range(50):
        line = stream.readline()
        if not line:
            break
        match = re.search(pattern, line)
        if match:
            return match
    raise AssertionError(f"meshctl never printed {pattern!r}")


def test_browser_login_receives_the_platform_token_on_the_loopback_redirect(
    meshctl: Meshctl, mgmt: ManagementPlane, standin: StandIn
) -> None:
    token = mgmt.platform_token()
    standin.login_result = {"accessToken": token, "expiresIn": "3600"}
    proc = meshctl.popen("login", "--server", standin.url, "--no-browser", "--timeout", "60")
    try:
        url = read_until(proc.stderr, r"(http://\S+/v2/oidc/login\?\S+)").group(1)
        redirect = parse_qs(urlsplit(url).query)["redirectUri"][0]
        assert redirect.startswith("http://127.0.0.1:") and "/callback?state=" in redirect

        # A callback without meshctl's state (another local page) is refused; meshctl waits on.
        forged = urlsplit(redirect)._replace(query="state=forged&accessToken=evil").geturl()
        assert httpx.get(forged).status_code == 400
        assert proc.poll() is None

        # The "browser": the server's login page redirects to the loopback listener.
        page = httpx.get(url, follow_redirects=True, timeout=10)
        assert page.status_code == 200 and "Login complete" in page.text
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert token not in out + err
    creds = stored_credentials(meshctl)
    assert creds["method"] == "browser" and creds["accessToken"] == token
    # The received token is the real server's: it works there.
    assert "users/admin" in meshctl.ok("--server", mgmt.url, "get", "policy", "root")


def test_browser_login_shows_the_error_the_server_redirects_with(
    meshctl: Meshctl, standin: StandIn
) -> None:
    standin.login_result = {
        "error": "access_denied",
        "errorDescription": "the user declined the consent",
    }
    proc = meshctl.popen("login", "--server", standin.url, "--no-browser", "--timeout", "60")
    try:
        url = read_until(proc.stderr, r"(http://\S+/v2/oidc/login\?\S+)").group(1)
        page = httpx.get(url, follow_redirects=True, timeout=10)
        assert page.status_code == 400 and "the user declined the consent" in page.text
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 3
    assert err.splitlines()[-1] == (
        "error: login failed (access_denied): the user declined the consent"
    )
    assert not meshctl.config_file.exists()


def test_token_exchange_sends_rfc8693_and_stores_the_platform_token(
    meshctl: Meshctl, mgmt: ManagementPlane, standin: StandIn
) -> None:
    platform = mgmt.platform_token()
    standin.token_handler = lambda form: (
        200,
        {
            "access_token": platform,
            "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
            "token_type": "Bearer",
            "expires_in": 900,
        },
    )
    meshctl.ok(
        "login", "--server", standin.url, "--use-token-exchange", "--access-token", "-",
        input="provider.access.token\n",
    )  # fmt: skip
    (form,) = standin.token_requests
    assert form == {
        "grant_type": TOKEN_EXCHANGE,
        "subject_token": "provider.access.token",
        "subject_token_type": "urn:ietf:params:oauth:token-type:access_token",
        "requested_token_type": "urn:ietf:params:oauth:token-type:access_token",
    }
    creds = stored_credentials(meshctl)
    assert creds["method"] == "token-exchange" and creds["accessToken"] == platform
    assert "users/admin" in meshctl.ok("--server", mgmt.url, "get", "policy", "root")


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (
            401,
            {
                "code": 16,
                "message": V1_REFUSAL,
                "details": [
                    {"reason": "UNAUTHENTICATED", "metadata": {"reason": "token_version_1"}}
                ],
            },
            f"(UNAUTHENTICATED 401, token_version_1): {V1_REFUSAL}",
        ),
        (
            400,
            {"error": "invalid_request", "error_description": "subject_token is required"},
            "(INVALID_ARGUMENT 400): invalid_request: subject_token is required",
        ),
    ],
    ids=["api-body-v1-token", "oauth-body"],
)
def test_token_exchange_refusals_show_the_server_reason(
    meshctl: Meshctl, standin: StandIn, status: int, body: dict[str, object], expected: str
) -> None:
    standin.token_handler = lambda form: (status, body)
    line = meshctl.fails(
        3, "login", "--server", standin.url, "--use-token-exchange", "--access-token", "v1.tok.en"
    )
    assert line == f"error: the management plane refused the login {expected}"
    assert "v1.tok.en" not in line
    assert not meshctl.config_file.exists()


# ---- device code: real provider (RFC 8628), stand-in management plane -----------------


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProvider]:
    log = tmp_path_factory.mktemp("oidc") / "provider.log"
    running = start_provider(["http://127.0.0.1/unused"], log)
    yield running
    running.stop()


def approve_device(url: str, account: str) -> str:
    """Act as the user's browser on the provider's device pages (browser-less interaction)."""
    with httpx.Client(timeout=10) as browser:
        response = browser.get(url)
        for _ in range(20):
            if response.status_code in (302, 303):
                location = urljoin(str(response.url), response.headers["location"])
                if "/interaction/" in location:
                    location += f"?account={account}"
                response = browser.get(location)
                continue
            action = re.search(r'<form[^>]*action="([^"]+)"', response.text)
            if action is None or 'id="op.deviceInputForm"' in response.text:
                return response.text
            fields = dict(
                re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', response.text)
            )
            response = browser.post(urljoin(str(response.url), action.group(1)), data=fields)
    raise AssertionError("the device pages did not finish")


def jwt_claims(token: str) -> dict[str, object]:
    payload = token.split(".")[1]
    claims: dict[str, object] = json.loads(
        base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    )
    return claims


def device_standin(standin: StandIn, provider: RunningProvider, platform: str) -> None:
    discovery = httpx.get(provider.configuration_uri).json()
    standin.configuration.update(
        deviceCodeSupported=True,
        deviceCodeClientId=DEVICE_CLIENT_ID,
        deviceAuthorizationEndpoint=discovery["device_authorization_endpoint"],
        tokenEndpoint=discovery["token_endpoint"],
        issuer=discovery["issuer"],
    )

    def exchange(form: dict[str, str]) -> tuple[int, dict[str, object]]:
        claims = jwt_claims(form["subject_token"])
        if claims.get("aud") != DEVICE_CLIENT_ID or claims.get("iss") != discovery["issuer"]:
            return 401, {"code": 16, "message": "not an ID token for the device client"}
        return 200, {"access_token": platform, "token_type": "Bearer", "expires_in": 600}

    standin.token_handler = exchange


def run_device_login(
    meshctl: Meshctl, standin: StandIn, account: str, scope_flags: list[str]
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        meshctl.argv("login", "--server", standin.url, "--use-device-code", *scope_flags),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=meshctl.environ(),
    )
    assert proc.stdin is not None
    if not scope_flags:  # meshctl asks for them
        proc.stdin.write("acme\neng\n")
    proc.stdin.close()
    proc.stdin = None  # closed: communicate() must not flush it again
    prompt = read_until(proc.stderr, r"enter the code (\S+)")
    code = prompt.group(1)
    if not scope_flags:  # the questions were asked on stderr, before the instructions
        assert prompt.string.startswith("Organization: Tenant: To sign in, open "), prompt.string
    complete = read_until(proc.stderr, r"\(or open (\S+)\)").group(1)
    assert code in complete
    approve_device(complete, account)
    return proc


def test_device_code_login_polls_the_provider_and_exchanges_its_id_token(
    meshctl: Meshctl, mgmt: ManagementPlane, standin: StandIn, provider: RunningProvider
) -> None:
    platform = mgmt.platform_token()
    device_standin(standin, provider, platform)
    proc = run_device_login(meshctl, standin, "alice", [])
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    (form,) = standin.token_requests
    assert form["subject_token_type"] == "urn:ietf:params:oauth:token-type:id_token"
    assert (form["organization"], form["tenant"]) == ("acme", "eng")
    assert jwt_claims(form["subject_token"])["sub"] == "alice"
    assert form["subject_token"] not in out + err
    data = yaml.safe_load(meshctl.config_file.read_text())["profiles"]["default"]
    assert data["credentials"]["method"] == "device-code"
    assert data["credentials"]["accessToken"] == platform
    assert (data["organization"], data["tenant"]) == ("acme", "eng")  # remembered as defaults


def test_device_code_login_denied_by_the_user_exits_3(
    meshctl: Meshctl, standin: StandIn, provider: RunningProvider, mgmt: ManagementPlane
) -> None:
    device_standin(standin, provider, mgmt.platform_token())
    proc = run_device_login(meshctl, standin, "deny", ["--org", "acme", "--tenant", "eng"])
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 3
    assert err.splitlines()[-1] == (
        "error: device login failed (access_denied): the sign-in was denied at the identity "
        "provider"
    )
    assert standin.token_requests == []
