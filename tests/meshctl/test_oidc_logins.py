"""Browser, device-code and token-exchange logins, end to end.

meshctl runs in a subprocess against a real ``mgmt-api serve`` whose install
config points at the real test OIDC provider (npm ``oidc-provider``,
tests/support/oidc_provider). The "browser" is an HTTP client that follows
the redirects and logs in through the provider's browser-less interaction
route. Every stored token is used for a real API call afterwards.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO
from urllib.parse import parse_qs, urljoin, urlsplit

import httpx
import pytest
import yaml

from mgmt_api.identity.token_exchange import V1_REFUSAL
from mgmt_api.identity.user_mapping import BINDING_LABEL
from tests.identity.browser import approve_device
from tests.identity.install_config import oidc_section, write_install_config
from tests.identity.provider_tokens import client_credentials_token
from tests.meshctl.conftest import ManagementPlane, Meshctl, launch, shut_down, unique
from tests.support.net import free_port
from tests.support.oidc_provider.launcher import (
    API_V1,
    API_V2,
    EXCHANGE_CLIENT_ID,
    EXCHANGE_CLIENT_SECRET,
    OTHER_CLIENT_ID,
    OTHER_CLIENT_SECRET,
    RunningProvider,
    start_provider,
)


@dataclass
class IdentityPlane:
    """A management plane with OIDC configured, its provider, and an organization where the
    provider's account ``alice`` exists (bound to the OIDC configuration) and can read."""

    plane: ManagementPlane
    provider: RunningProvider
    org: str


@pytest.fixture(scope="module")
def idp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IdentityPlane]:
    data = tmp_path_factory.mktemp("mgmt-oidc")
    port = free_port()
    callback = f"http://127.0.0.1:{port}/v2/oidc/callback"
    provider = start_provider([callback], data / "provider.log")
    try:
        config = write_install_config(data, oidc_section(data, provider, callback))
        plane = launch(data, port, "--config", str(config))
        try:
            org = unique("idp")
            with plane.admin() as admin:
                created = admin.post("/v2/organizations", json={"name": org, "organization": {}})
                assert created.status_code == 200, created.text
                for user in (f"/v2/organizations/{org}/users", "/v2/users"):
                    name = "alice" if user.startswith("/v2/org") else EXCHANGE_CLIENT_ID
                    bound = {"labels": {BINDING_LABEL: "corp"}}
                    response = admin.post(user, json={"name": name, "user": bound})
                    assert response.status_code == 200, response.text
                policy = admin.get(f"/v2/organizations/{org}/policy").json()
                policy["allow"].append(
                    {
                        "role": "rbac/reader",
                        "subjects": [
                            {"user": f"organizations/{org}/users/alice"},
                            {"user": f"users/{EXCHANGE_CLIENT_ID}"},
                        ],
                    }
                )
                response = admin.put(f"/v2/organizations/{org}/policy", json=policy)
                assert response.status_code == 200, response.text
            yield IdentityPlane(plane, provider, org)
        finally:
            shut_down(plane)
    finally:
        provider.stop()


def stored_credentials(ctl: Meshctl) -> dict[str, str]:
    data = yaml.safe_load(ctl.config_file.read_text())
    creds: dict[str, str] = data["profiles"][data["currentProfile"]]["credentials"]
    return creds


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


def browse(url: str, account: str = "alice", visited: list[str] | None = None) -> httpx.Response:
    """The user's browser: follow every redirect, logging ``account`` in at the provider;
    every URL it is sent to is appended to ``visited`` (its history)."""
    with httpx.Client(timeout=10) as browser:
        response = browser.get(url)
        for _ in range(20):
            if response.status_code not in (302, 303):
                return response
            location = urljoin(str(response.url), response.headers["location"])
            if visited is not None:
                visited.append(location)
            if "/interaction/" in location:
                location += f"?account={account}"
            response = browser.get(location)
    raise AssertionError("too many redirects")


@pytest.mark.parametrize(
    "mode",
    [[], ["--use-device-code", "--org", "o", "--tenant", "t"],
     ["--use-token-exchange", "--access-token", "abc.def.ghi"]],
    ids=["browser", "device-code", "token-exchange"],
)  # fmt: skip
def test_oidc_logins_refuse_clearly_when_the_server_has_no_oidc(
    meshctl: Meshctl, mode: list[str]
) -> None:
    line = meshctl.fails(3, "login", "--server", meshctl.server, "--no-browser", *mode)
    assert "OIDC login is not configured on this management plane" in line
    assert "--username" in line  # says what to do instead
    assert "abc.def.ghi" not in line


# ---- browser ---------------------------------------------------------------------------------


def start_browser_login(ctl: Meshctl) -> tuple[subprocess.Popen[str], str]:
    proc = ctl.popen("login", "--server", ctl.server, "--no-browser", "--timeout", "60")
    url = read_until(proc.stderr, r"(http://\S+/v2/oidc/login\?\S+)").group(1)
    return proc, url


def test_browser_login_redeems_a_one_time_code_from_the_loopback_redirect(
    tmp_path_factory: pytest.TempPathFactory, idp: IdentityPlane
) -> None:
    """RFC 8252: meshctl sends its PKCE challenge, the loopback redirect carries a one-time
    code (never the token), and meshctl redeems it with its verifier."""
    ctl = Meshctl(tmp_path_factory.mktemp("home"), idp.plane.url)
    proc, url = start_browser_login(ctl)
    visited: list[str] = []
    try:
        query = parse_qs(urlsplit(url).query)
        redirect = query["redirectUri"][0]
        assert redirect.startswith("http://127.0.0.1:") and "/callback?state=" in redirect
        assert query["codeChallengeMethod"] == ["S256"] and len(query["codeChallenge"][0]) == 43

        # A callback without meshctl's state (another local page) is refused; meshctl waits on.
        forged = urlsplit(redirect)._replace(query="state=forged&code=evil").geturl()
        assert httpx.get(forged).status_code == 400
        assert proc.poll() is None

        page = browse(url, visited=visited)
        assert page.status_code == 200 and "Login complete" in page.text
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    creds = stored_credentials(ctl)
    assert creds["method"] == "browser"
    assert creds["accessToken"] not in out + err
    loopback = [u for u in visited if u.startswith(redirect)]
    assert len(loopback) == 1 and "code=" in loopback[0]
    assert all(creds["accessToken"] not in u for u in visited)  # not in browser history
    # The code was used by meshctl; whoever copies it from the history gets nothing.
    stolen = parse_qs(urlsplit(loopback[0]).query)["code"][0]
    replay = httpx.post(
        f"{idp.plane.url}/v2/oidc/token",
        data={"grant_type": "authorization_code", "code": stolen, "code_verifier": "x" * 43},
    )
    assert replay.status_code == 400 and "invalid_grant" in replay.text
    # The token is the server's session of alice: her team-less reader grant applies.
    assert idp.org in ctl.ok("get", "org", idp.org)


def test_browser_login_shows_the_error_the_server_redirects_with(
    tmp_path_factory: pytest.TempPathFactory, idp: IdentityPlane
) -> None:
    ctl = Meshctl(tmp_path_factory.mktemp("home"), idp.plane.url)
    proc, url = start_browser_login(ctl)
    try:
        page = browse(url, account="deny")
        assert page.status_code == 400 and "denied by" in page.text
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 3
    assert err.splitlines()[-1] == (
        'error: login failed (access_denied): denied by <b>test</b> & "friends"'
    )
    assert not ctl.config_file.exists()


def test_browser_login_of_an_account_without_a_user_record_is_refused(
    tmp_path_factory: pytest.TempPathFactory, idp: IdentityPlane
) -> None:
    ctl = Meshctl(tmp_path_factory.mktemp("home"), idp.plane.url)
    proc, url = start_browser_login(ctl)
    try:
        assert browse(url, account="bob").status_code == 400
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 3
    assert err.splitlines()[-1].startswith("error: login failed (unknown_user): there is no user")
    assert not ctl.config_file.exists()


# ---- token exchange --------------------------------------------------------------------------


def test_token_exchange_trades_the_provider_token_for_a_platform_token(
    tmp_path_factory: pytest.TempPathFactory, idp: IdentityPlane
) -> None:
    ctl = Meshctl(tmp_path_factory.mktemp("home"), idp.plane.url)
    token = client_credentials_token(
        idp.provider, EXCHANGE_CLIENT_ID, EXCHANGE_CLIENT_SECRET, API_V2
    )
    out = ctl.ok(
        "login", "--server", idp.plane.url, "--use-token-exchange", "--access-token", "-",
        input=token + "\n",
    )  # fmt: skip
    creds = stored_credentials(ctl)
    assert creds["method"] == "token-exchange" and creds["accessToken"] != token
    assert token not in out
    assert idp.org in ctl.ok("get", "org", idp.org)


@pytest.mark.parametrize(
    ("client", "secret", "resource", "expected"),
    [
        (
            EXCHANGE_CLIENT_ID,
            EXCHANGE_CLIENT_SECRET,
            API_V1,
            f"(UNAUTHENTICATED 401, token_version_1): {V1_REFUSAL}",
        ),
        (
            OTHER_CLIENT_ID,
            OTHER_CLIENT_SECRET,
            API_V2,
            "(PERMISSION_DENIED 403, client_not_allowed): token exchange is allowed only for "
            "the configured client",
        ),
    ],
    ids=["version-1-token", "other-client"],
)
def test_token_exchange_refusals_show_the_server_reason(
    tmp_path_factory: pytest.TempPathFactory,
    idp: IdentityPlane,
    client: str,
    secret: str,
    resource: str,
    expected: str,
) -> None:
    ctl = Meshctl(tmp_path_factory.mktemp("home"), idp.plane.url)
    token = client_credentials_token(idp.provider, client, secret, resource)
    line = ctl.fails(
        3, "login", "--server", idp.plane.url, "--use-token-exchange", "--access-token", token
    )
    assert line.startswith(f"error: the management plane refused the login {expected}")
    assert token not in line
    assert not ctl.config_file.exists()


# ---- device code -----------------------------------------------------------------------------


def run_device_login(
    ctl: Meshctl, account: str, scope_flags: list[str], answers: str = ""
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        ctl.argv("login", "--server", ctl.server, "--use-device-code", *scope_flags),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ctl.environ(),
    )
    assert proc.stdin is not None
    proc.stdin.write(answers)
    proc.stdin.close()
    proc.stdin = None  # closed: communicate() must not flush it again
    prompt = read_until(proc.stderr, r"enter the code (\S+)")
    code = prompt.group(1)
    if answers:  # the questions were asked on stderr, before the instructions
        assert prompt.string.startswith("Organization: Tenant: To sign in, open "), prompt.string
    complete = read_until(proc.stderr, r"\(or open (\S+)\)").group(1)
    assert code in complete

    async def user_in_browser() -> None:
        async with httpx.AsyncClient(timeout=10.0) as browser:
            await approve_device(browser, complete, account)

    asyncio.run(user_in_browser())
    return proc


def test_device_code_login_polls_the_provider_and_exchanges_its_id_token(
    tmp_path_factory: pytest.TempPathFactory, idp: IdentityPlane
) -> None:
    ctl = Meshctl(tmp_path_factory.mktemp("home"), idp.plane.url)
    proc = run_device_login(ctl, "alice", [], answers=f"{idp.org}\neng\n")
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    data = yaml.safe_load(ctl.config_file.read_text())["profiles"]["default"]
    assert data["credentials"]["method"] == "device-code"
    assert data["credentials"]["accessToken"] not in out + err
    assert (data["organization"], data["tenant"]) == (idp.org, "eng")  # remembered as defaults
    assert idp.org in ctl.ok("get", "org", idp.org)


def test_device_code_login_denied_by_the_user_exits_3(
    tmp_path_factory: pytest.TempPathFactory, idp: IdentityPlane
) -> None:
    ctl = Meshctl(tmp_path_factory.mktemp("home"), idp.plane.url)
    proc = run_device_login(ctl, "deny", ["--org", idp.org, "--tenant", "eng"])
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 3
    assert err.splitlines()[-1] == (
        "error: device login failed (access_denied): the sign-in was denied at the identity "
        "provider"
    )
    assert not ctl.config_file.exists()
