"""deploy/envoy/mtls-gateway.yaml, run by a real Envoy against both services on mutual TLS.

The example is used as written, with only its addresses and certificate file
paths replaced: ``extauthz serve`` and ``ratelimit serve`` (default server)
require client certificates of the gateways' CA; the gateway presents one
and checks the services' names. A request with a valid token is allowed and
counted, the third is rate limited, one without a token is denied, and a
gateway whose certificate the services do not trust gets nothing through.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from extauthz.cli import mint_demo_token
from meshplane.envoy_binary import envoy_path
from tests.support.certs import CertificateAuthority, Issued
from tests.support.net import free_port, wait_for_port
from tests.support.processes import Service

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy/envoy/mtls-gateway.yaml"

LIMITS = """\
domain: edge-gateway
descriptors:
  - key: route
    value: checkout
    rate_limit: {unit: year, requests_per_unit: 2}
"""


class _Shop(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"shop"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return


def _tls_flags(leaf: Issued, client_ca: Path) -> list[str]:
    return ["--tls-cert", str(leaf.cert), "--tls-key", str(leaf.key),
            "--tls-client-ca", str(client_ca)]  # fmt: skip


def _gateway_config(ports: dict[str, int], files: dict[str, Path], listen: int) -> dict[str, Any]:
    """The example with its addresses and file paths replaced (nothing else)."""
    config: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    config["admin"]["address"]["socket_address"]["port_value"] = 0
    listener = config["static_resources"]["listeners"][0]
    listener["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": listen}
    for cluster in config["static_resources"]["clusters"]:
        address = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
        address["address"]["socket_address"] = {
            "address": "127.0.0.1",
            "port_value": ports[cluster["name"]],
        }
    text = json.dumps(config)
    for name, path in files.items():
        text = text.replace(f"/etc/envoy/tls/{name}", str(path))
    assert "/etc/envoy/tls/" not in text
    loaded: dict[str, Any] = json.loads(text)
    return loaded


class Gateway:
    def __init__(self, config: dict[str, Any], workdir: Path, port: int) -> None:
        self.port = port
        path = workdir / f"gateway-{port}.json"
        path.write_text(json.dumps(config))
        self.proc = subprocess.Popen(
            [str(envoy_path()), "-c", str(path), "--use-dynamic-base-id", "--log-level", "error"],
            stderr=(workdir / f"gateway-{port}.log").open("wb"),
        )
        wait_for_port(port, timeout=60)

    def get(self, path: str, token: str | None = None) -> tuple[int, dict[str, str]]:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}")
        if token:
            request.add_header("authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, dict(response.headers)
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("mtls")
    for name in ("services", "gateways", "strangers"):
        (root / name).mkdir()
    services = CertificateAuthority(root / "services", name="services CA")
    gateways = CertificateAuthority(root / "gateways", name="gateways CA")
    strangers = CertificateAuthority(root / "strangers", name="strangers CA")
    limits = root / "limits"
    limits.mkdir()
    (limits / "gateway.yaml").write_text(LIMITS)
    ports = {"extauthz": free_port(), "ratelimit": free_port()}
    extauthz = Service(
        ["extauthz.cli", "serve", "--config", str(ROOT / "deploy/extauthz/demo-policy.yaml"),
         "--listen", f"127.0.0.1:{ports['extauthz']}",
         *_tls_flags(services.issue("extauthz.meshplane.svc"), gateways.path)],
        ports["extauthz"],
        root / "extauthz.log",
    ).start()  # fmt: skip
    ratelimit = Service(
        ["ratelimit.cli", "serve", "--config", str(limits),
         "--listen", f"127.0.0.1:{ports['ratelimit']}",
         *_tls_flags(services.issue("ratelimit.meshplane.svc"), gateways.path)],
        ports["ratelimit"],
        root / "ratelimit.log",
    ).start()  # fmt: skip
    shop = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Shop)
    thread = threading.Thread(target=shop.serve_forever, daemon=True)
    thread.start()
    ports["shop"] = shop.server_address[1]
    try:
        yield {"ports": ports, "root": root, "services": services, "gateways": gateways,
               "strangers": strangers}  # fmt: skip
    finally:
        shop.shutdown()
        shop.server_close()
        assert extauthz.stop() == 0
        assert ratelimit.stop() == 0


def _gateway(setup: dict[str, Any], client: Issued) -> Gateway:
    files = {
        "gateway.crt": client.cert,
        "gateway.key": client.key,
        "services-ca.crt": setup["services"].path,
    }
    port = free_port()
    return Gateway(_gateway_config(setup["ports"], files, port), setup["root"], port)


def test_the_example_gateway_authorizes_and_limits_over_mutual_tls(
    setup: dict[str, Any],
) -> None:
    gateway = _gateway(setup, setup["gateways"].issue("gateway", client=True))
    try:
        token = mint_demo_token("secret", "/checkout", 600)
        assert gateway.get("/checkout")[0] == 403  # no token: ext_authz denies
        first = gateway.get("/checkout", token)
        assert first[0] == 200, first
        assert first[1]["x-ratelimit-remaining"] == "1"
        assert gateway.get("/checkout", token)[0] == 200
        third = gateway.get("/checkout", token)
        assert third[0] == 429, third
        assert third[1]["x-ratelimit-remaining"] == "0"
    finally:
        gateway.close()


def test_a_gateway_the_services_do_not_trust_gets_nothing_through(
    setup: dict[str, Any],
) -> None:
    gateway = _gateway(setup, setup["strangers"].issue("intruder", client=True))
    try:
        token = mint_demo_token("secret", "/checkout", 600)
        # The handshake with ext_authz fails: status_on_error, never the shop.
        assert gateway.get("/checkout", token)[0] == 503
    finally:
        gateway.close()
