"""Start and stop ``provider.mjs`` (the npm ``oidc-provider``) on a free loopback port.

Needs Node.js 20+ and the package installed with
``npm ci --prefix tests/support/oidc_provider`` (``scripts/setup`` does
it); when either is missing the fixture fails with that command in the
message instead of a confusing stack trace.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.net import free_port

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "provider.mjs"
SETUP_HINT = "run `npm ci --prefix tests/support/oidc_provider` (scripts/setup does this)"

# The fixed clients of provider.mjs.
WEB_CLIENT_ID = "meshplane-web"
WEB_CLIENT_SECRET = "web-secret-for-tests-only"
DEVICE_CLIENT_ID = "meshctl-device"
DEVICE_SHORT_CLIENT_ID = "meshctl-device-short"
EXCHANGE_CLIENT_ID = "meshplane-exchange"
EXCHANGE_CLIENT_SECRET = "exchange-secret-for-tests-only"
OTHER_CLIENT_ID = "other-sp"
OTHER_CLIENT_SECRET = "other-secret-for-tests-only"
API_V2 = "urn:meshplane:api"
API_V1 = "urn:meshplane:api-v1"


@dataclass
class RunningProvider:
    issuer: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def configuration_uri(self) -> str:
        return f"{self.issuer}/.well-known/openid-configuration"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""


def start_provider(redirect_uris: list[str], log_path: Path) -> RunningProvider:
    """Run the provider and wait until its discovery document answers."""
    node = shutil.which("node")
    if node is None:
        raise AssertionError(f"node is not installed; install Node.js 20+ and {SETUP_HINT}")
    if not (HERE / "node_modules" / "oidc-provider").is_dir():
        raise AssertionError(f"the test OIDC provider's npm packages are missing: {SETUP_HINT}")
    port = free_port()
    args = [node, str(SCRIPT), "--port", str(port)]
    for uri in redirect_uris:
        args += ["--redirect-uri", uri]
    with log_path.open("wb") as log:  # the child keeps its own descriptor
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=HERE)
    running = RunningProvider(f"http://127.0.0.1:{port}", port, process, log_path)
    deadline = time.monotonic() + 30
    try:
        while True:
            if process.poll() is not None:
                raise AssertionError(f"the OIDC provider exited:\n{running.log_tail()}")
            try:
                response = httpx.get(running.configuration_uri, timeout=1.0)
                if response.status_code == 200:
                    return running
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"the OIDC provider did not start:\n{running.log_tail()}")
            time.sleep(0.1)
    except BaseException:
        running.stop()
        raise
