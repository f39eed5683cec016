"""Basic login, profiles, credential storage and the authentication exit codes (3, 6)."""

from __future__ import annotations

import stat

import yaml

from tests.meshctl.conftest import ADMIN_PASSWORD, ManagementPlane, Meshctl, unique


def test_basic_login_stores_a_token_not_the_password_in_a_private_file(meshctl: Meshctl) -> None:
    result = meshctl.run(
        "login", "--server", meshctl.server, "--username", "admin", "--password-stdin",
        input=ADMIN_PASSWORD + "\n",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Logged in to" in result.stdout and "users/admin" in result.stdout
    assert ADMIN_PASSWORD not in result.stdout + result.stderr

    path = meshctl.config_file
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    text = path.read_text()
    assert ADMIN_PASSWORD not in text
    stored = yaml.safe_load(text)
    profile = stored["profiles"][stored["currentProfile"]]
    assert profile["server"] == meshctl.server
    assert profile["credentials"]["method"] == "basic"
    token = profile["credentials"]["accessToken"]
    assert token.count(".") == 2  # a JWT session token from /v2/auth/token

    # The token works, and is never shown.
    assert "user: users/admin" in meshctl.ok("get", "policy", "root")
    view = meshctl.ok("config", "view")
    assert token not in view and "accessToken: '***'" in view


def test_a_wrong_password_exits_3_with_one_line(meshctl: Meshctl) -> None:
    line = meshctl.fails(
        3, "login", "--server", meshctl.server, "--username", "admin", "--password-stdin",
        input="not-the-password\n",
    )  # fmt: skip
    assert "UNAUTHENTICATED (401)" in line and "password" in line
    assert not meshctl.config_file.exists()


def test_commands_without_login_exit_3_and_say_how_to_log_in(meshctl: Meshctl) -> None:
    line = meshctl.fails(3, "--server", meshctl.server, "get", "organizations")
    assert "not logged in" in line and "meshctl login" in line


def test_a_rejected_or_expired_session_exits_3_and_says_to_log_in(admin_ctl: Meshctl) -> None:
    data = yaml.safe_load(admin_ctl.config_file.read_text())
    credentials = data["profiles"]["default"]["credentials"]
    credentials["accessToken"] += "tampered"
    admin_ctl.config_file.write_text(yaml.safe_dump(data))
    line = admin_ctl.fails(3, "get", "organizations")  # the server's verdict
    assert line.startswith("error: UNAUTHENTICATED (401): ") and "meshctl login" in line

    credentials["expiresAt"] = "2000-01-01T00:00:00Z"
    admin_ctl.config_file.write_text(yaml.safe_dump(data))
    line = admin_ctl.fails(3, "get", "organizations")  # known locally, no request
    assert "expired" in line and "meshctl login" in line


def test_an_unreachable_server_exits_6(admin_ctl: Meshctl) -> None:
    from tests.support.net import free_port

    line = admin_ctl.fails(6, "--server", f"http://127.0.0.1:{free_port()}", "get", "orgs")
    assert "cannot reach the management plane" in line


def test_permission_denied_exits_3_and_names_the_permission(
    admin_ctl: Meshctl, mgmt: ManagementPlane
) -> None:
    org = unique("perm")
    admin_ctl.ok("apply", "-f", "-", input=f"kind: Organization\nmetadata: {{name: {org}}}\n")
    with mgmt.admin() as http:
        created = http.post(
            f"/v2/organizations/{org}/users",
            json={"name": "bob", "user": {"loginName": "bob", "password": "bob-password-1"}},
        )
        assert created.status_code == 200, created.text
    admin_ctl.ok(
        "--profile", "bob", "login", "--server", admin_ctl.server,
        "--username", f"{org}/bob", "--password-stdin", input="bob-password-1\n",
    )  # fmt: skip
    line = admin_ctl.fails(3, "--profile", "bob", "get", "organization", org)
    assert "PERMISSION_DENIED (403)" in line and f"READ on organizations/{org}" in line
    # The admin profile is untouched by the second login.
    assert org in admin_ctl.ok("get", "organization", org)


def test_profiles_keep_servers_defaults_and_credentials_apart(admin_ctl: Meshctl) -> None:
    admin_ctl.ok("config", "set-profile", "staging", "--server", "http://127.0.0.1:9", "--org", "o")
    listing = admin_ctl.ok("config", "get-profiles")
    assert "* default" in listing and "logged in (basic)" in listing
    assert "staging\thttp://127.0.0.1:9\tnot logged in" in listing

    admin_ctl.ok("config", "use-profile", "staging")
    assert admin_ctl.fails(3, "get", "orgs").endswith("(profile 'staging'); run meshctl login")
    assert "user: users/admin" in admin_ctl.ok("--profile", "default", "get", "policy", "root")
    assert admin_ctl.fails(4, "config", "use-profile", "nope").startswith("error: no profile")

    admin_ctl.ok("config", "use-profile", "default")
    admin_ctl.ok("logout")
    assert admin_ctl.fails(3, "get", "orgs").startswith("error: not logged in")


def test_usage_errors_exit_2(admin_ctl: Meshctl) -> None:
    assert "unknown kind 'widgets'" in admin_ctl.fails(2, "get", "widgets")
    assert "pass --org" in admin_ctl.fails(2, "get", "tenants")
    assert "--password-stdin needs --username" in admin_ctl.fails(2, "login", "--password-stdin")
    assert "choose one of" in admin_ctl.fails(2, "login", "--username", "a", "--use-device-code")
    assert "--output must be one of" in admin_ctl.fails(2, "get", "orgs", "-o", "xml")
    bad = admin_ctl.run("get", "orgs", "--no-such-flag")  # click's own usage errors
    assert bad.returncode == 2 and "No such option" in bad.stderr


def test_meshctl_never_imports_the_server_package(meshctl: Meshctl) -> None:
    import subprocess
    import sys

    probe = (
        "import sys, meshctl.cli, meshctl.login, meshctl.oauth; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('mgmt_api', 'fastapi', 'sqlalchemy')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True,
        env=meshctl.environ(),
    ).stdout  # fmt: skip
    assert out.strip() == "[]"
