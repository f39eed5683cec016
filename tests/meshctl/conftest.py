"""Fixtures: a real management plane subprocess and meshctl run as a user runs it.

One ``mgmt-api serve`` (SQLite in a temp dir) serves the whole meshctl suite;
tests isolate themselves with uniquely named organizations. Every meshctl
call is a subprocess (``python -m meshctl``) with ``HOME`` and
``XDG_CONFIG_HOME`` pointing at the test's own temp dir, so profiles never
touch the real user's files and tests never share credentials.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.net import free_port, wait_for_port

ADMIN_PASSWORD = "meshctl-admin-password"
REPO = Path(__file__).resolve().parents[2]


@dataclass
class ManagementPlane:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def admin(self) -> httpx.Client:
        """A direct HTTP client: the tests' independent view of the server state."""
        return httpx.Client(base_url=self.url, auth=("admin", ADMIN_PASSWORD), timeout=30)

    def platform_token(self) -> str:
        """A real session token of the admin, as the server's OIDC login would mint one."""
        with self.admin() as http:
            response = http.post("/v2/auth/token")
        assert response.status_code == 200, response.text
        token: str = response.json()["accessToken"]
        return token


def launch(data: Path, port: int, *extra: str) -> ManagementPlane:
    """Start ``mgmt-api serve`` (SQLite in ``data``) on ``port`` and wait until it is ready."""
    log = data / "server.log"
    env = {
        **os.environ,
        "MESHPLANE_ADMIN_PASSWORD": ADMIN_PASSWORD,
        "MESHPLANE_DATA_DIR": str(data),
    }
    with open(log, "ab") as log_file:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mgmt_api.cli",
                "serve",
                "--listen",
                f"127.0.0.1:{port}",
                "--database",
                f"sqlite:///{data / 'db.sqlite'}",
                # A port of its own: the default one may be another mgmt-api's.
                "--grpc-listen",
                f"127.0.0.1:{free_port()}",
                *extra,
            ],
            env=env,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=log_file,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_port(port, timeout=60)
        deadline = time.monotonic() + 30
        while httpx.get(url + "/readyz", timeout=5).status_code != 200:
            assert time.monotonic() < deadline, "management plane never became ready"
            time.sleep(0.05)
    except Exception:
        process.kill()
        raise RuntimeError(f"mgmt-api did not start:\n{log.read_text()[-3000:]}") from None
    return ManagementPlane(url, process, log)


def shut_down(plane: ManagementPlane) -> None:
    plane.process.send_signal(signal.SIGTERM)
    try:
        plane.process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        plane.process.kill()
        plane.process.wait()


@pytest.fixture(scope="session")
def mgmt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagementPlane]:
    """The management plane without an identity provider (no install config)."""
    plane = launch(tmp_path_factory.mktemp("mgmt"), free_port())
    yield plane
    shut_down(plane)


@dataclass
class Meshctl:
    """Runs ``python -m meshctl`` with an isolated HOME and config dir."""

    home: Path
    server: str
    env: dict[str, str] = field(default_factory=dict)

    @property
    def config_file(self) -> Path:
        return self.home / "config" / "meshctl" / "config.yaml"

    def environ(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("MESHCTL_") and k not in {"EDITOR", "VISUAL"}
        }
        env.update(
            {"HOME": str(self.home), "XDG_CONFIG_HOME": str(self.home / "config"), **self.env}
        )
        env.update(extra or {})
        return env

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "meshctl", *args]

    def run(
        self, *args: str, input: str | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args),
            check=False,
            input=input,
            capture_output=True,
            text=True,
            env=self.environ(env),
            cwd=REPO,
            timeout=60,
        )

    def ok(self, *args: str, input: str | None = None, env: dict[str, str] | None = None) -> str:
        result = self.run(*args, input=input, env=env)
        assert result.returncode == 0, (args, result.returncode, result.stdout, result.stderr)
        return result.stdout

    def fails(
        self, code: int, *args: str, input: str | None = None, env: dict[str, str] | None = None
    ) -> str:
        """Run, expect exit ``code`` and exactly one ``error:`` line; return that line."""
        result = self.run(*args, input=input, env=env)
        assert result.returncode == code, (args, result.returncode, result.stdout, result.stderr)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("error: ")]
        assert len(errors) == 1 and errors[0] == lines[-1], result.stderr
        return errors[0]

    def login_admin(self) -> None:
        self.ok(
            "login", "--server", self.server, "--username", "admin", "--password-stdin",
            input=ADMIN_PASSWORD + "\n",
        )  # fmt: skip

    def popen(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(*args),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.environ(env),
            cwd=REPO,
        )


@pytest.fixture
def meshctl(tmp_path: Path, mgmt: ManagementPlane) -> Meshctl:
    """meshctl with a fresh home; not logged in."""
    return Meshctl(tmp_path / "home", mgmt.url)


@pytest.fixture
def admin_ctl(meshctl: Meshctl) -> Meshctl:
    """meshctl logged in as the bootstrap admin."""
    meshctl.login_admin()
    return meshctl


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def as_json(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def shared_admin(tmp_path_factory: pytest.TempPathFactory, mgmt: ManagementPlane) -> Meshctl:
    """One logged-in admin home per module: resource tests need no fresh login each."""
    ctl = Meshctl(tmp_path_factory.mktemp("admin-home"), mgmt.url)
    ctl.login_admin()
    return ctl
