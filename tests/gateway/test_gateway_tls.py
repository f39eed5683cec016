"""A gateway reaching mgmt-api's ADS over TLS, with a client certificate (mTLS).

mgmt-api serves its gRPC port (policy stream, ADS, tunnel) with a server
certificate and requires client certificates from a test CA. A gateway
Envoy booted with a ``grpcs://`` bootstrap (CA, client certificate) gets its
configuration and ACKs it; one without a client certificate, or one that
expects another server name, is refused at the handshake and never shows in
the status.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshplane import gateway_contract as gc
from meshplane.control_plane import load_credentials
from tests.mgmt_api.harness import MgmtServer, ok
from tests.support.certs import CertificateAuthority
from tests.support.cluster_credentials import write_credential
from tests.support.envoy import EnvoyProcess
from tests.support.net import free_port
from tests.support.processes import wait_until

ORG, CLUSTER = "tls", "c1"
CLUSTER_PATH = f"/v2/organizations/{ORG}/clusters/{CLUSTER}"


class Setup:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.envoys: list[EnvoyProcess] = []
        self.ca = CertificateAuthority(tmp)
        server = self.ca.issue("mgmt-api")
        self.client = self.ca.issue("gateway", client=True)
        (tmp / "mgmt").mkdir()
        self.mgmt = MgmtServer(
            data_dir=str(tmp / "mgmt"),
            extra_args=(
                "--grpc-tls-cert",
                str(server.cert),
                "--grpc-tls-key",
                str(server.key),
                "--grpc-tls-client-ca",
                str(self.ca.path),
            ),
        ).start()
        self.admin = self.mgmt.admin()
        ok(self.admin.post("/v2/organizations", json={"name": ORG, "organization": {}}))
        created = ok(
            self.admin.post(
                f"/v2/organizations/{ORG}/clusters", json={"name": CLUSTER, "cluster": {}}
            )
        )
        self.credentials = write_credential(created, "gateway", tmp / "credentials.json")

    def gateway(
        self, instance: str, *, host: str = "127.0.0.1", wait_ready: bool = True, **tls: Any
    ) -> EnvoyProcess:
        token = load_credentials(self.credentials).token(
            ttl=gc.GATEWAY_TOKEN_TTL_SECONDS, audience=gc.XDS_AUDIENCE
        )
        node = gc.GatewayNode(ORG, CLUSTER, instance, "127.0.0.1", free_port())
        boot = gc.bootstrap(
            node,
            ads=f"grpcs://{host}:{self.mgmt.grpc_port}",
            token=token,
            admin=("127.0.0.1", 0),
            ca_file=str(self.ca.path),
            **tls,
        )
        # A name mgmt-api's certificate does not carry still has to reach it.
        if host != "127.0.0.1":
            endpoint = boot["static_resources"]["clusters"][0]["load_assignment"]["endpoints"][0]
            endpoint["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]["address"] = (
                "127.0.0.1"
            )
            boot["static_resources"]["clusters"][0]["type"] = "STATIC"
        envoy = EnvoyProcess(boot, directory=self.tmp / instance).start(wait_ready=wait_ready)
        self.envoys.append(envoy)
        return envoy

    def gateways(self) -> dict[str, dict[str, Any]]:
        status = ok(self.admin.get(f"{CLUSTER_PATH}/status"))
        return {i["instance"]: i for i in status["instances"] if i["kind"] == gc.GATEWAY_KIND}

    def close(self) -> None:
        for envoy in self.envoys:
            envoy.stop()
        self.admin.close()
        self.mgmt.close()


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    st = Setup(Path(tmp_path_factory.mktemp("gateway-tls")))
    try:
        yield st
    finally:
        st.close()


def handshake_failures(envoy: EnvoyProcess) -> int:
    stats = envoy.admin("GET", "/stats?filter=^cluster.meshplane_xds.").text
    total = 0
    for line in stats.splitlines():
        name, _, value = line.partition(": ")
        if name.endswith(
            ("ssl.connection_error", "upstream_cx_connect_fail", "ssl.fail_verify_san")
        ):
            total += int(value)
    return total


def xds_connected(envoy: EnvoyProcess) -> int:
    """Envoy's ``control_plane.connected_state`` gauge: 1 while its ADS stream is up."""
    stats = envoy.admin("GET", "/stats?filter=^control_plane.connected_state$").text
    return int(stats.partition(": ")[2] or 0)


def test_with_a_client_certificate_the_gateway_gets_its_configuration(setup: Setup) -> None:
    setup.gateway("mtls", cert_file=str(setup.client.cert), key_file=str(setup.client.key))
    entry = wait_until(
        lambda: (g := setup.gateways().get("mtls")) and g["lastResult"] == "ACK" and g,
        60,
        "the gateway's ACK over mTLS",
    )
    assert entry["upToDate"] is True


@pytest.mark.parametrize(
    ("case", "host", "tls"),
    [
        ("no client certificate", "127.0.0.1", {}),
        ("another server name", "mgmt-api.other.example", {"client": True}),
    ],
)
def test_a_gateway_the_handshake_refuses_gets_nothing(
    setup: Setup, case: str, host: str, tls: dict[str, bool]
) -> None:
    instance = "refused-" + case.split(maxsplit=1)[0]
    client = (
        {"cert_file": str(setup.client.cert), "key_file": str(setup.client.key)}
        if tls.get("client")
        else {}
    )
    # Not waiting for /ready: with no configuration coming, Envoy turns LIVE only once
    # its initial fetch timeouts (CDS, then LDS) have passed, which proves nothing here.
    envoy = setup.gateway(instance, host=host, wait_ready=False, **client)
    # Two refused handshakes: the first attempt and a retry, so the refusal is not a
    # race of the first connection, and nothing got through in between.
    wait_until(lambda: handshake_failures(envoy) >= 2, 60, f"{case}: refused handshakes")
    assert xds_connected(envoy) == 0
    assert instance not in setup.gateways()
    listeners = envoy.admin("GET", "/listeners?format=json").json()
    assert listeners.get("listener_statuses", []) == []
