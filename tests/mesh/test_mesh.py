"""The mesh: workloads in two namespaces behind real sidecar Envoys, each run by its pod agent.

One stack for the module: mgmt-api, three workloads (``a`` and ``b`` in
``ns1``, ``c`` in ``ns2``), each behind its sidecar agent and Envoy. Calls
go app → its sidecar's outbound listener (by service name) → mTLS with the
workload certificates (keys made by each pod's agent, signed by mgmt-api,
served to Envoy over SDS on a Unix socket) → the callee's sidecar's inbound
listener → the callee app. Certificates live :data:`TTL` seconds here, so they rotate
(at half-life, with a new key) while the module runs.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from meshplane.sidecar_contract import SIDECAR_KIND, spiffe_id
from meshplane.workload_contract import SVID_SECRET
from mgmt_api.domain import mesh_ca
from tests.mgmt_api.harness import ok
from tests.support.certs import CertificateAuthority
from tests.support.gateway import CLUSTER_PATH
from tests.support.mesh import TRUST_DOMAIN, CallLoop, MeshStack, Workload
from tests.support.processes import wait_until

#: The stack's certificate lifetime (s): short, so the tests that wait for a renewal
#: (at half-life) wait seconds; the lower bound of ``MESHPLANE_SIDECAR_CERT_TTL`` is 10 s.
TTL = 12
#: How long a wait for a renewal (or a failed one) may take on a loaded machine.
RENEWAL_DEADLINE = 60


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MeshStack]:
    stack = MeshStack(
        Path(tmp_path_factory.mktemp("mesh")), certificate_ttl=f"{TTL}s", services=False
    )
    try:
        stack.workloads_started(("a", "ns1", "sa-a"), ("b", "ns1", "sa-b"), ("c", "ns2", "sa-c"))
        stack.sidecars_converged()
        yield stack
    finally:
        stack.close()


def test_every_sidecar_shows_in_the_status_with_its_ack(mesh: MeshStack) -> None:
    status = mesh.sidecars_converged()
    sidecars = {i["instance"] for i in status["instances"] if i["kind"] == SIDECAR_KIND}
    assert sidecars == {"ns1-a", "ns1-b", "ns2-c"}
    assert status["desiredVersions"][SIDECAR_KIND]


def test_services_are_reached_by_name_through_both_sidecars(mesh: MeshStack) -> None:
    a, b, c = mesh.workloads
    for caller, callee in ((a, b), (a, c), (c, a), (b, b)):
        response = caller.call(callee)
        assert response.status_code == 200, (caller.name, callee.name, response.text)
        assert response.json()["app"] == callee.name
    # Bare service names resolve in the caller's own namespace only.
    assert a.client.get("/", headers={"host": "b"}).json()["app"] == "b"
    assert c.client.get("/", headers={"host": "b"}).status_code == 404
    assert a.client.get("/", headers={"host": "nope.ns1"}).status_code == 404


def test_a_sidecar_that_leaves_is_no_endpoint_and_one_that_joins_is(mesh: MeshStack) -> None:
    a = mesh.workloads[0]
    d = mesh.workload("d", "ns2", "sa-d")
    mesh.sidecars_converged()
    assert a.call(d).json()["app"] == "d"
    # SIGTERM drains the agent: Envoy stops, the sockets go, the exit code is 0.
    sockets = d.sockets
    mesh.workloads.remove(d)
    assert d.stop() == 0, d.log.read_text()[-3000:]
    assert not any(Path(p).exists() for p in (sockets.xds, sockets.sds, sockets.admin))
    mesh.report_pods()
    mesh.sidecars_converged()
    assert a.call(d).status_code == 404


def test_the_bootstrap_holds_no_token_and_the_admin_api_is_a_socket(mesh: MeshStack) -> None:
    a = mesh.workloads[0]
    bootstrap = (Path(a.sockets.directory) / "envoy.yaml").read_text()
    doc = yaml.safe_load(bootstrap)
    assert doc["admin"] == {"address": {"pipe": {"path": a.sockets.admin}}}
    assert "initial_metadata" not in bootstrap and "Bearer" not in bootstrap
    token = a.token_file.read_text().strip()
    dump = a.admin("GET", "/config_dump").text
    assert token not in dump and "Bearer" not in dump
    # Envoy binds no TCP port but the mesh's listeners: nothing else answers on loopback.
    listeners = a.admin("GET", "/listeners", params={"format": "json"}).json()
    ports = {
        entry["local_address"]["socket_address"]["port_value"]
        for entry in listeners["listener_statuses"]
    }
    assert ports == {a.node.inbound_port, a.node.outbound_port}
    # The sockets and their directory are the agent's (and its Envoy's) alone.
    for path in (a.sockets.xds, a.sockets.sds, a.sockets.admin, a.sockets.directory):
        assert os.stat(path).st_mode & 0o077 == 0, (path, oct(os.stat(path).st_mode))
    # The agent's own endpoint: alive, and ready while it holds a certificate.
    for path in ("/healthz", "/readyz"):
        assert httpx.get(f"http://127.0.0.1:{a.metrics_port}{path}", timeout=10).status_code == 200


def test_the_private_key_is_in_no_config_dump_and_no_log(mesh: MeshStack) -> None:
    a = mesh.workloads[0]
    dump = a.admin("GET", "/config_dump", params={"include_eds": "true"}).json()
    secrets = [
        s
        for section in dump["configs"]
        if section["@type"].endswith("SecretsConfigDump")
        for s in section.get("dynamic_active_secrets", [])
    ]
    svid = [s for s in secrets if s["name"] == SVID_SECRET]
    assert svid, secrets
    key = svid[0]["secret"]["tls_certificate"]["private_key"]
    assert key == {"inline_string": "[redacted]"}, key
    text = json.dumps(dump)
    assert "PRIVATE KEY" not in text
    token = a.token_file.read_text().strip()
    for log in (a.log, a.envoy_log):
        content = log.read_text()
        assert "PRIVATE KEY" not in content, log
        assert token not in content, log


def test_every_sidecar_holds_a_certificate_of_its_own_spiffe_id(mesh: MeshStack) -> None:
    # The cluster names no trust domain: the default, also in its ClusterConfig.
    assert ok(mesh.admin.post(f"{CLUSTER_PATH}/config"))["trustDomain"] == TRUST_DOMAIN
    for workload in mesh.workloads:
        certificates = workload.certificates()
        assert certificates, workload.name
        for certificate in certificates:
            assert certificate["subject_alt_names"] == [{"uri": workload.spiffe_id()}]
    expiries = mesh.certificate_expiries()
    assert set(expiries) == {w.node.instance for w in mesh.workloads}
    now = time.time()
    assert all(now < e <= now + TTL + 1 for e in expiries.values()), expiries


def _plaintext_answer(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nhost: a.ns1\r\n\r\n")
        try:
            return sock.recv(100)
        except ConnectionResetError:
            return b""


def _handshake(port: int, client_pem: tuple[Path, Path] | None) -> None:
    """A TLS 1.2 handshake (whose failure TLS 1.2 reports in the handshake itself)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    if client_pem is not None:
        context.load_cert_chain(*client_pem)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        with context.wrap_socket(sock) as tls:
            tls.sendall(b"GET / HTTP/1.1\r\nhost: a.ns1\r\n\r\n")
            raise AssertionError(f"the handshake succeeded and answered {tls.recv(100)!r}")


def _impostor(tmp: Path, identity: str) -> tuple[Path, Path]:
    """A certificate for a real workload's SPIFFE id, from another CA of the same trust domain."""
    now = time.time()
    ca = mesh_ca.new_ca(TRUST_DOMAIN, now, mesh_ca.new_key())
    key = mesh_ca.new_key()
    certificate = mesh_ca.issue_svid(ca, identity, key.public_key(), now)
    (tmp / "impostor.crt").write_text(mesh_ca.pem(certificate))
    (tmp / "impostor.key").write_text(mesh_ca.key_pem(key))
    return tmp / "impostor.crt", tmp / "impostor.key"


def test_the_inbound_listener_refuses_plaintext_and_foreign_certificates(
    mesh: MeshStack, tmp_path: Path
) -> None:
    a = mesh.workloads[0]
    port = a.node.inbound_port
    assert not _plaintext_answer(port).startswith(b"HTTP/")
    foreign = CertificateAuthority(tmp_path).issue("someone", client=True)
    impostor = _impostor(tmp_path, spiffe_id(TRUST_DOMAIN, "ns1", "sa-b"))
    for client in (None, (foreign.cert, foreign.key), impostor):
        with pytest.raises((ssl.SSLError, ConnectionResetError)):
            _handshake(port, client)
    # The same listener serves a sidecar of the mesh CA.
    assert mesh.workloads[1].call(a).status_code == 200


def test_certificates_rotate_under_load_with_no_failed_request(mesh: MeshStack) -> None:
    a, c = mesh.workloads[0], mesh.workloads[2]
    # The expiries before the serials: a renewal between the two reads then makes the
    # measured lifetime longer, never shorter.
    expiries = mesh.certificate_expiries()
    before = {w.name: w.serials() for w in (a, c)}
    assert all(len(s) == 1 for s in before.values()), before
    with CallLoop.both_ways(a, c) as load:
        # Half of the lifetime, plus a wake-up of the stream (5 s), plus slack.
        wait_until(
            lambda: all(w.serials().isdisjoint(before[w.name]) for w in (a, c)),
            RENEWAL_DEADLINE,
            "both sidecars to rotate their certificates",
        )
        rotated = time.time()
        calls = load.calls
        wait_until(lambda: load.calls > calls + 10, 30, "more calls after the rotation")
    assert load.failures == [], load.failures[:5]
    after = mesh.certificate_expiries()
    assert all(after[w.node.instance] > expiries[w.node.instance] for w in (a, c)), (
        after,
        expiries,
    )
    # At half-life, not before: the first certificates were signed at expiry - TTL.
    signed = min(expiries[w.node.instance] for w in (a, c)) - TTL
    assert rotated - signed >= TTL * 0.4, (rotated, signed)


def test_deleting_the_pod_ends_the_sidecar_stream_and_its_certificates(mesh: MeshStack) -> None:
    a = mesh.workloads[0]
    e = mesh.workload("e", "ns2", "sa-e")
    mesh.sidecars_converged()
    assert a.call(e).json()["app"] == "e"
    assert e.node.instance in mesh.certificate_expiries()
    # The cluster agent no longer reports the pod: its token proves nothing any more.
    mesh.extra_pods = []
    mesh.workloads.remove(e)
    mesh.report_pods()

    def closed() -> bool:
        instances = mesh.status()["instances"]
        return not any(i["instance"] == e.node.instance and i["connected"] for i in instances)

    wait_until(closed, 30, "the revoked sidecar's stream to close")
    # No certificate is tracked (or issued) for it any more, and it is no endpoint.
    wait_until(
        lambda: e.node.instance not in mesh.certificate_expiries(), 30, "e's gauge series to go"
    )
    wait_until(lambda: a.call(e).status_code == 404, 30, "e to leave a's routes")
    e.stop()


def _sign_failures(workload: Workload) -> float:
    for line in workload.agent_metrics().splitlines():
        if line.startswith("meshplane_sidecar_agent_sign_failures_total "):
            return float(line.split()[1])
    return 0.0


def test_the_token_file_is_read_again_for_every_sign(mesh: MeshStack) -> None:
    """The kubelet rewrites the token: the agent uses the file's current content. An expired
    token fails Sign (the certificate held keeps serving); a fresh one signs again."""
    a = mesh.workloads[0]
    t = mesh.workload("t", "ns2", "sa-t")
    try:
        mesh.sidecars_converged()
        first = t.serials()
        mesh.issuer.write(t.token_file, t.pod, now=time.time() - 7200, ttl=3600)
        wait_until(
            lambda: _sign_failures(t) >= 1,
            RENEWAL_DEADLINE,
            "a Sign with the expired token to fail",
        )
        assert a.call(t).status_code == 200  # the certificate it holds still serves
        mesh.issuer.write(t.token_file, t.pod)
        wait_until(
            lambda: t.serials().isdisjoint(first),
            RENEWAL_DEADLINE,
            "a certificate from the new token",
        )
        assert a.call(t).json()["app"] == "t"
    finally:
        mesh.remove(t)


def test_while_mgmt_api_is_away_calls_go_on_and_the_agents_sign_again_after(
    mesh: MeshStack,
) -> None:
    """mgmt-api stops for a while: the sidecars keep their configuration and certificates
    and every call goes on (Sign fails and is retried); once it is back, the agents
    relay their Envoys' new streams and sign again."""
    a, c = mesh.workloads[0], mesh.workloads[2]
    assert mesh.mgmt is not None
    failures = {w.name: _sign_failures(w) for w in (a, c)}
    with CallLoop.both_ways(a, c) as load:
        mesh.mgmt.stop()
        try:
            wait_until(
                lambda: all(_sign_failures(w) > failures[w.name] for w in (a, c)),
                RENEWAL_DEADLINE,
                "Sign to fail while mgmt-api is away",
            )
            calls = load.calls
            wait_until(lambda: load.calls > calls + 10, 30, "more calls while it is away")
        finally:
            away = list(load.failures)
            mesh.mgmt.start()
    assert away == [], away[:5]
    before = {w.name: w.serials() for w in (a, c)}
    wait_until(
        lambda: all(w.serials().isdisjoint(before[w.name]) for w in (a, c)),
        RENEWAL_DEADLINE,
        "both agents to sign again",
    )
    mesh.sidecars_converged()
    assert a.call(c).json()["app"] == "c"
