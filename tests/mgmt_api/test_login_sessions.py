"""Sessions end with the password they were opened with; redirects stay on this server.

* An admin's password reset, or a user's own change, ends the user's API
  session tokens and console sign-ins at once (401 / back to the sign-in
  page), and a new login works.
* The trailing-slash redirect answers a relative ``Location``: a client's
  ``Host`` header never becomes the target of a redirect.
"""

from __future__ import annotations

import base64
import contextlib
import re
import socket
from collections.abc import Iterator

import httpx
import pytest

from tests.mgmt_api.harness import ADMIN_PASSWORD, MgmtServer, err, ok, unique

OLD, NEW = "first-password-1", "second-password-2"


def _user(admin: httpx.Client, org: str, role: str | None = None) -> tuple[str, str]:
    """A local user of ``org`` with password OLD (and ``role`` on the org): (name, login)."""
    name = unique("u")
    ok(admin.post(f"/v2/organizations/{org}/users", json={"name": name, "user": {"password": OLD}}))
    if role is not None:
        policy = ok(admin.get(f"/v2/organizations/{org}/policy"))
        subject = {"user": f"organizations/{org}/users/{name}"}
        policy["allow"] = [*(policy.get("allow") or []), {"role": role, "subjects": [subject]}]
        ok(admin.put(f"/v2/organizations/{org}/policy", json=policy))
    return name, f"{org}/{name}"


def _token(server: MgmtServer, login: str, password: str) -> str:
    with server.client(auth=(login, password)) as c:
        token: str = ok(c.post("/v2/auth/token"))["accessToken"]
    return token


def _bearer(server: MgmtServer, token: str) -> httpx.Client:
    return server.client(headers={"Authorization": f"Bearer {token}"})


@contextlib.contextmanager
def _console(server: MgmtServer, login: str, password: str) -> Iterator[httpx.Client]:
    """A console sign-in through the login form (nonce cookie + field), as a browser does."""
    with server.client() as browser:
        form = browser.get("/ui/login")
        nonce = re.search(r'name="_csrf" value="([^"]+)"', form.text)
        assert nonce is not None, form.text
        fields = {"_csrf": nonce.group(1), "next": "/ui/", "login": login, "password": password}
        signed = browser.post("/ui/login", data=fields)
        assert signed.status_code == 303 and signed.headers["location"] == "/ui/", signed.text
        yield browser


def _set_password(client: httpx.Client, path: str, password: str) -> None:
    user = ok(client.get(path))
    ok(client.put(path, json={**user, "password": password}))


def _ended(server: MgmtServer, token: str, console: httpx.Client, path: str) -> None:
    """The token is refused by /v2 and the console sends its cookie back to sign in."""
    with _bearer(server, token) as stale:
        body = err(stale.get(f"{path}/permissions"), 401)
    assert "password was changed" in body["message"]
    page = console.get("/ui/")
    assert page.status_code == 303 and page.headers["location"].startswith("/ui/login"), page.text


def _works(server: MgmtServer, token: str, console: httpx.Client, path: str) -> None:
    with _bearer(server, token) as fresh:
        ok(fresh.get(f"{path}/permissions"))
    assert console.get("/ui/").status_code == 200


def _signs_in(server: MgmtServer, login: str, password: str, path: str) -> None:
    """A new API login and a new console sign-in both work."""
    with _console(server, login, password) as console:
        _works(server, _token(server, login, password), console, path)


# A reset to the same password ends them too: "someone may know it", and a new
# salt makes a new hash either way.
@pytest.mark.parametrize("new", [NEW, OLD], ids=["new-password", "same-password"])
def test_an_admin_reset_ends_the_users_sessions(
    server: MgmtServer, admin: httpx.Client, org: str, new: str
) -> None:
    name, login = _user(admin, org)
    path = f"/v2/organizations/{org}/users/{name}"
    token = _token(server, login, OLD)
    with _console(server, login, OLD) as console:
        _works(server, token, console, path)
        _set_password(admin, path, new)
        _ended(server, token, console, path)
    if new != OLD:
        with server.client(auth=(login, OLD)) as old:
            err(old.post("/v2/auth/token"), 401)
    _signs_in(server, login, new, path)


def test_a_users_own_change_ends_their_other_sessions(
    server: MgmtServer, admin: httpx.Client, org: str
) -> None:
    name, login = _user(admin, org, role="rbac/admin")  # may set its own password
    path = f"/v2/organizations/{org}/users/{name}"
    kept = _token(server, login, OLD)
    changer = _token(server, login, OLD)
    with _console(server, login, OLD) as console, _bearer(server, changer) as own:
        _set_password(own, path, NEW)
        _ended(server, kept, console, path)
        err(own.get(f"{path}/permissions"), 401)  # the session that made the change too
    _signs_in(server, login, NEW, path)


def test_other_users_sessions_survive_a_reset(
    server: MgmtServer, admin: httpx.Client, org: str
) -> None:
    name, _ = _user(admin, org)
    other, other_login = _user(admin, org)
    token = _token(server, other_login, OLD)
    _set_password(admin, f"/v2/organizations/{org}/users/{name}", NEW)
    with _bearer(server, token) as c:
        ok(c.get(f"/v2/organizations/{org}/users/{other}/permissions"))


def _raw_get(
    server: MgmtServer, target: str, host: str, authorization: str = ""
) -> tuple[int, dict[str, str]]:
    """A GET with exactly this request target and ``Host`` (no client normalizes them)."""
    auth = f"Authorization: {authorization}\r\n" if authorization else ""
    request = f"GET {target} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(request.encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    headers = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(head[0].split()[1]), headers


def test_the_trailing_slash_redirect_ignores_the_host_header(server: MgmtServer, org: str) -> None:
    basic = "Basic " + base64.b64encode(f"admin:{ADMIN_PASSWORD}".encode()).decode()
    for target, location in (
        (f"/v2/organizations/{org}/", f"/v2/organizations/{org}"),
        ("/v2/organizations/?pageSize=1", "/v2/organizations?pageSize=1"),
        ("/ui", "/ui/"),
    ):
        status, headers = _raw_get(server, target, "evil.example", basic)
        assert status in (307, 308), (target, status)
        assert headers["location"] == location, target
    # Under /v2 an anonymous caller is refused before anything else, redirects included.
    status, headers = _raw_get(server, f"/v2/organizations/{org}/", "evil.example")
    assert status == 401 and "location" not in headers, (status, headers)
    # A path that a browser would read as another host is not redirected.
    for target in ("//evil.example/v2/organizations/", "/\\evil.example/v2/organizations/"):
        status, headers = _raw_get(server, target, "evil.example")
        assert status == 404 and "location" not in headers, (target, status, headers)
