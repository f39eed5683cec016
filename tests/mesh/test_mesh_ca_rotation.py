"""The mesh CA rotates under load, started by meshctl, with zero failed requests.

A stack of mgmt-api and two workloads (``a`` in ``ns1``, ``c`` in ``ns2``)
behind real sidecar Envoys, calling each other over mTLS in a loop while the
cluster's mesh CA goes idle → trusting → signing → done; once on one replica
(SQLite), once on two replicas sharing PostgreSQL, the rotation started and
watched on replica A while the sidecars stream from replica B (every replica
agrees on the phase; both tick, and a phase is applied once). What each sidecar
trusts and presents is read from its own Envoy (``/config_dump`` of its
active secrets: the ``mesh-ca`` bundle and the ``svid`` chain), never from
mgmt-api. The rotation is started and watched with ``meshctl`` (a subprocess
logged in as the admin), its REST refusals checked with an editor's token.

Relies on (for whoever changes the sidecar flow): ``tests.support.mesh``'s
``MeshStack``/``Workload`` (``workload``, ``sidecars_converged``, ``status``,
``Workload.call`` and ``Workload.admin``, the Envoy admin API on its socket; two
replicas with ``database_url``), the sidecar Envoys' dynamic
secrets named ``svid`` and ``mesh-ca`` (:mod:`meshplane.workload_contract`),
and each pod agent signing again when the trust bundle's first CA is not the
issuer of its current certificate.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from meshplane.workload_contract import CA_SECRET, SVID_SECRET
from mgmt_api.domain import ca_rotation, mesh_ca
from tests.distribution.test_replicas import database  # noqa: F401 - a fixture
from tests.meshctl.conftest import Meshctl
from tests.mgmt_api.harness import ADMIN_PASSWORD, err
from tests.mgmt_api.rbac_helpers import bound_account
from tests.support.gateway import CLUSTER, CLUSTER_PATH, ORG
from tests.support.mesh import CallLoop, MeshStack, Workload
from tests.support.processes import wait_until

TARGET = f"{ORG}/{CLUSTER}"
#: Renewals every 8 s (half-life), each phase settled 2 s after its last certificate: with
#: the 2 s tick, two sidecars' renewals always leave a gap (at least 4 s) long enough for
#: ``trusting`` to settle within one renewal round (docs/mesh.md, "How long it takes").
MGMT_ENV = {"MESHPLANE_SIDECAR_CERT_TTL": "16s", "MESHPLANE_MESH_CA_SETTLE": "2s"}
CONFLICT = 5  # meshctl's exit code for a 409


@pytest.fixture(scope="module", params=["one replica", "two replicas"])
def mesh(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MeshStack]:
    tmp = Path(tmp_path_factory.mktemp("mesh-ca"))
    mp = pytest.MonkeyPatch()
    stack: MeshStack | None = None
    try:
        mp.setenv("MESHPLANE_MESH_CA_SETTLE", MGMT_ENV["MESHPLANE_MESH_CA_SETTLE"])
        if request.param == "one replica":
            stack = MeshStack(tmp, MGMT_ENV["MESHPLANE_SIDECAR_CERT_TTL"], services=False)
        else:
            _, url = request.getfixturevalue("database")
            # What crosses the replicas does so through PostgreSQL NOTIFY.
            mp.setenv("MESHPLANE_REVISION_POLL", "1h")
            stack = MeshStack(
                tmp, MGMT_ENV["MESHPLANE_SIDECAR_CERT_TTL"], database_url=url, services=False
            )
        stack.workloads_started(("a", "ns1", "sa-a"), ("c", "ns2", "sa-c"))
        stack.sidecars_converged()
        yield stack
    finally:
        mp.undo()
        if stack is not None:
            stack.close()


@pytest.fixture(scope="module")
def ctl(tmp_path_factory: pytest.TempPathFactory, mesh: MeshStack) -> Meshctl:
    assert mesh.mgmt is not None
    meshctl = Meshctl(tmp_path_factory.mktemp("mesh-ca-home"), mesh.mgmt.url)
    meshctl.ok(
        "login", "--server", mesh.mgmt.url, "--username", "admin", "--password-stdin",
        input=ADMIN_PASSWORD + "\n",
    )  # fmt: skip
    return meshctl


def _secrets(workload: Workload) -> dict[str, dict[str, Any]]:
    dump = workload.admin(
        "GET", "/config_dump", params={"resource": "dynamic_active_secrets"}
    ).json()
    return {c["name"]: c["secret"] for c in dump.get("configs", [])}


def trusted(workload: Workload) -> list[str]:
    """Fingerprints of the CAs the sidecar's ``mesh-ca`` bundle holds, in order."""
    pem = _secrets(workload)[CA_SECRET]["validation_context"]["trusted_ca"]["inline_string"]
    return [mesh_ca.fingerprint(c) for c in x509.load_pem_x509_certificates(pem.encode())]


def signed_by(workload: Workload, fingerprint: str, cas: dict[str, x509.Certificate]) -> bool:
    """Whether the certificate the sidecar presents was signed by the CA of ``fingerprint``."""
    chain = _secrets(workload)[SVID_SECRET]["tls_certificate"]["certificate_chain"]
    leaf = x509.load_pem_x509_certificate(chain["inline_string"].encode())
    try:
        leaf.verify_directly_issued_by(cas[fingerprint])
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _section(ctl: Meshctl) -> dict[str, Any]:
    data = json.loads(ctl.ok("status", "--cluster", TARGET, "-o", "json"))
    section: dict[str, Any] = data["clusters"][0]["meshCa"]
    return section


def test_a_rotation_needs_set_policy_on_the_cluster(mesh: MeshStack) -> None:
    assert mesh.mgmt is not None
    _, editor = bound_account(
        mesh.mgmt, mesh.admin, ORG, "rbac/editor", CLUSTER_PATH.removeprefix("/v2/")
    )
    with editor:
        err(editor.post(f"{CLUSTER_PATH}/meshca:rotate"), 403, "PERMISSION_DENIED")
    assert mesh.status()["meshCa"]["phase"] == "idle"


def test_the_mesh_ca_rotates_under_load_with_no_failed_request(
    mesh: MeshStack, ctl: Meshctl
) -> None:
    a, c = mesh.workloads
    before = mesh.status()["meshCa"]
    old = before["signing"]["fingerprint"]
    assert before["phase"] == "idle" and all(trusted(w) == [old] for w in (a, c))
    with CallLoop.both_ways(a, c) as load:
        started = json.loads(ctl.ok("rotate", "meshca", "--cluster", TARGET, "-o", "json"))
        assert started["phase"] == "trusting" and started["old"]["fingerprint"] == old
        new = started["new"]["fingerprint"]
        assert new != old
        # A second start while it runs: 409 with the error body, exit 5 in meshctl.
        line = ctl.fails(CONFLICT, "rotate", "meshca", "--cluster", TARGET)
        assert "ABORTED" in line, line
        err(mesh.admin.post(f"{CLUSTER_PATH}/meshca:rotate"), 409, "ABORTED")

        # Trusting: both CAs in every bundle, the old one first and still signing.
        wait_until(lambda: all(trusted(w) == [old, new] for w in (a, c)), 30, "the two-CA bundle")
        wait_until(lambda: _section(ctl)["phase"] == "signing", 90, "the signing phase")
        # Signing: the new CA first; every sidecar re-issued by it.
        wait_until(lambda: all(trusted(w) == [new, old] for w in (a, c)), 30, "the new CA first")
        cas = _cas(a)
        wait_until(
            lambda: all(signed_by(w, new, cas) for w in (a, c)), 30, "certificates of the new CA"
        )
        wait_until(lambda: _section(ctl)["phase"] == "done", 90, "the old CA to be dropped")
        wait_until(lambda: all(trusted(w) == [new] for w in (a, c)), 30, "the new CA alone")
        calls = load.calls
        wait_until(lambda: load.calls > calls + 10, 30, "more calls after the rotation")
    assert load.failures == [], load.failures[:5]
    assert load.calls > 100, load.calls
    assert all(signed_by(w, new, cas) for w in (a, c))

    done = _section(ctl)
    assert done["old"]["fingerprint"] == old and done["new"]["fingerprint"] == new
    assert done["signing"]["fingerprint"] == new
    assert done["progress"] == {"sidecars": 2, "onNewCa": 2}
    # Every phase ended on the signing records, not on the bounded wait.
    took = _seconds(done["phaseSince"]) - _seconds(done["startTime"])
    assert took < ca_rotation.TRUST_WAIT, took
    table = ctl.ok("status", "--cluster", TARGET)
    assert f"{TARGET}: mesh CA done" in table and "2/2" in table, table


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _cas(workload: Workload) -> dict[str, x509.Certificate]:
    """fingerprint → CA certificate, from the sidecar's own bundle."""
    pem = _secrets(workload)[CA_SECRET]["validation_context"]["trusted_ca"]["inline_string"]
    return {mesh_ca.fingerprint(ca): ca for ca in x509.load_pem_x509_certificates(pem.encode())}
