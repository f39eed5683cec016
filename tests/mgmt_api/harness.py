"""Runs ``mgmt-api serve`` as a real subprocess on a loopback port."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from tests.support.net import free_port, wait_for_port
from tests.support.processes import terminate

ADMIN_PASSWORD = "admin-password-for-tests"
#: httpx's default verification (certifi's CAs), built once: a client built with
#: ``verify=True`` loads the CA bundle again (about 20 ms), and the tests build
#: thousands of clients.
DEFAULT_VERIFY = httpx.create_ssl_context()


class MgmtServer:
    def __init__(
        self,
        database_url: str | None = None,
        data_dir: str | None = None,
        admin_password: str | None = ADMIN_PASSWORD,
        install_config: str | None = None,
        extra_args: tuple[str, ...] = (),
        tls_verify: Any = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.admin_password = admin_password
        self.env = env or {}  # extra environment (MESHPLANE_* settings)
        self.install_config = install_config  # --config: spec.identityProvider
        self.extra_args = extra_args  # e.g. --tls-cert/--tls-key
        # Set when the server speaks HTTPS: httpx's ``verify`` for it (the test
        # CA's file, or an SSLContext that also carries a client certificate).
        self.tls_verify = tls_verify
        self._owns_dir = data_dir is None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="meshplane-mgmt-")
        self.database_url = (
            database_url or f"sqlite+pysqlite:///{Path(self.data_dir) / 'mgmt-api.db'}"
        )
        self.port = free_port()
        self.grpc_port = free_port()  # PolicyDistribution; never the fixed default
        self.proc: subprocess.Popen[bytes] | None = None
        self.exit_code: int | None = None  # of the last stop()
        self.log_path = Path(self.data_dir) / f"server-{self.port}.log"

    @property
    def url(self) -> str:
        scheme = "https" if self.tls_verify is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def verify(self) -> Any:
        """httpx's ``verify`` for this server."""
        return DEFAULT_VERIFY if self.tls_verify is None else self.tls_verify

    def start(self) -> MgmtServer:
        env = {**os.environ, "MESHPLANE_DATA_DIR": self.data_dir, **self.env}
        env.pop("MESHPLANE_ADMIN_PASSWORD", None)
        if self.admin_password is not None:
            env["MESHPLANE_ADMIN_PASSWORD"] = self.admin_password
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mgmt_api.cli",
                "serve",
                "--listen",
                f"127.0.0.1:{self.port}",
                "--database",
                self.database_url,
                "--grpc-listen",
                f"127.0.0.1:{self.grpc_port}",
                *(["--config", self.install_config] if self.install_config else []),
                *self.extra_args,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(self.log_path, "ab"),  # noqa: SIM115
        )
        try:
            wait_for_port(self.port, timeout=60)
            deadline = time.monotonic() + 30
            while httpx.get(self.url + "/readyz", timeout=5, verify=self.verify).status_code != 200:
                if time.monotonic() > deadline:
                    raise TimeoutError("server never became ready")
                time.sleep(0.05)
        except Exception:
            self.stop()
            raise RuntimeError(
                f"mgmt-api failed to start:\n{self.log_path.read_text()[-4000:]}"
            ) from None
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.exit_code = terminate(self.proc, grace=20)
        self.proc = None

    def close(self) -> None:
        """Stop and remove the data directory this harness created."""
        self.stop()
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        self.proc = None

    def client(self, auth: Any = None, **kw: Any) -> httpx.Client:
        kw.setdefault("verify", self.verify)
        return httpx.Client(base_url=self.url, auth=auth, timeout=30, **kw)

    def admin(self) -> httpx.Client:
        return self.client(auth=("admin", ADMIN_PASSWORD))


def unique(prefix: str = "o") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def ok(response: httpx.Response) -> Any:
    assert response.status_code == 200, (response.status_code, response.text)
    return response.json()


def err(response: httpx.Response, status: int, reason: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.text)
    body: dict[str, Any] = response.json()
    assert set(body) == {"code", "message", "details"}, body
    if reason is not None:
        assert body["details"][0]["reason"] == reason, body
    return body
