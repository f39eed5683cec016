"""One real stack and one headless Chromium for the console's browser tests.

* mgmt-api (SQLite) as a subprocess; ratelimit and extauthz join it when a
  test has created a cluster and downloaded its install template through
  the console (:meth:`ConsoleStack.subscribe`), and so do a real Envoy and
  the cluster agent for the diagnostics page (:meth:`ConsoleStack.proxy_with_agent`).
* Debian's Chromium (``/usr/bin/chromium``, installed by ``scripts/setup``),
  driven by Playwright's own driver: Playwright never downloads a browser.
* Both are module-scoped: the browser files share them, and everything they
  start is stopped at teardown (services, then mgmt-api, then Chromium).

``MESHPLANE_CONSOLE_SCREENSHOTS=docs/console`` makes the tests write the
screenshots that docs/console.md shows.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.mgmt_api.harness import MgmtServer, ok
from tests.support.cluster_credentials import write_credential
from tests.support.envoy import EnvoyProcess, minimal_bootstrap
from tests.support.net import free_port
from tests.support.processes import Service, wait_until

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


class ConsoleStack:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        (tmp / "mgmt").mkdir()
        self.mgmt = MgmtServer(data_dir=str(tmp / "mgmt")).start()
        self.admin = self.mgmt.admin()
        self.services: list[Service] = []
        self.envoys: list[EnvoyProcess] = []
        self.templates: dict[str, dict[str, Any]] = {}  # by cluster, from subscribe()

    @property
    def url(self) -> str:
        return self.mgmt.url

    def _credentials(
        self, cluster: str, template: dict[str, Any], component: str = "agent"
    ) -> Path:
        path = self.tmp / f"{cluster}-{component}-credentials.json"
        return write_credential(template, component, path)

    def subscribe(self, org: str, cluster: str, template: dict[str, Any]) -> None:
        """Start ratelimit (in-memory counters) and extauthz for ``org/cluster`` with
        their keys of an install template the console downloaded."""
        self.templates[cluster] = template
        env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "REDIS_URL_FILE")}
        for service in ("ratelimit", "extauthz"):
            port = free_port()
            args = [f"{service}.cli", "serve", "--listen", f"127.0.0.1:{port}"]
            args += ["--control-plane", f"grpc://127.0.0.1:{self.mgmt.grpc_port}"]
            credentials = self._credentials(cluster, template, service)
            args += ["--cluster", f"{org}/{cluster}", "--credentials", str(credentials)]
            args += ["--cache-dir", str(self.tmp / f"{service}-{cluster}-cache")]
            log = self.tmp / f"{service}-{cluster}.log"
            self.services.append(Service(args, port, log, env).start())

    def proxy_with_agent(self, org: str, cluster: str) -> None:
        """A real Envoy as workload ``shop/web`` (instance ``web-1``) of ``org/cluster``,
        and ``meshplane-agent`` serving its diagnostics with the key :meth:`subscribe` got."""
        envoy = EnvoyProcess(minimal_bootstrap("127.0.0.1"), directory=self.tmp / "envoy").start()
        self.envoys.append(envoy)
        proxies = self.tmp / "proxies.json"
        entry = {"namespace": "shop", "workload": "web", "instance": "web-1"}
        entry |= {"adminAddress": envoy.admin_address, "logFile": str(envoy.log_path)}
        proxies.write_text(json.dumps({"proxies": [entry]}))
        port = free_port()
        args = ["agent", "--control-plane", f"grpc://127.0.0.1:{self.mgmt.grpc_port}"]
        args += ["--cluster", f"{org}/{cluster}", "--listen", f"127.0.0.1:{port}"]
        agent_key = self._credentials(cluster, self.templates[cluster], "agent")
        args += ["--credentials", str(agent_key)]
        args += ["--static-proxies", str(proxies)]
        self.services.append(Service(args, port, self.tmp / "agent.log").start())

        def connected() -> bool:
            url = f"http://127.0.0.1:{port}/readyz"
            try:
                return httpx.get(url, timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(connected, timeout=60, what="the agent's tunnel")

    def user(self, org: str, name: str, role: str) -> tuple[str, str]:
        """A local user of ``org`` holding ``role`` on it: (login, password)."""
        password = "console-user-password-1"
        ok(
            self.admin.post(
                f"/v2/organizations/{org}/users",
                json={"name": name, "user": {"loginName": name, "password": password}},
            )
        )
        policy = ok(self.admin.get(f"/v2/organizations/{org}/policy"))
        subject = {"user": f"organizations/{org}/users/{name}"}
        policy["allow"] = [*(policy.get("allow") or []), {"role": role, "subjects": [subject]}]
        ok(self.admin.put(f"/v2/organizations/{org}/policy", json=policy))
        return f"{org}/{name}", password

    def close(self) -> None:
        for service in self.services:
            service.stop()
        for envoy in self.envoys:
            envoy.stop()
        self.admin.close()
        self.mgmt.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleStack]:
    s = ConsoleStack(tmp_path_factory.mktemp("console"))
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: scripts/setup installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


class Shots:
    """Writes a page's screenshot into ``$MESHPLANE_CONSOLE_SCREENSHOTS`` when set."""

    def __init__(self) -> None:
        target = os.environ.get("MESHPLANE_CONSOLE_SCREENSHOTS")
        self.directory = Path(target) if target else None
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)

    def take(self, page: Any, name: str) -> None:
        if self.directory is not None:
            page.screenshot(path=str(self.directory / f"{name}.png"), full_page=True)


@pytest.fixture(scope="module")
def shots() -> Shots:
    return Shots()


def sign_in(page: Any, base: str, login: str, password: str) -> None:
    page.goto(base + "/ui/")
    page.fill("#login", login)
    page.fill("#password", password)
    page.click("form[action='/ui/login'] button[type=submit]")
    page.wait_for_url("**/ui/")


def fresh_page(browser: Any, base: str, login: str, password: str) -> Any:
    """A new browser session (its own cookies), signed in."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    context.set_default_timeout(30_000)
    page = context.new_page()
    sign_in(page, base, login, password)
    return page
