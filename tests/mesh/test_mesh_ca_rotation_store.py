"""A mesh CA rotation as the store runs it: a real (SQLite) store, two "replicas", a test clock.

The machine's rows are in ``test_mesh_ca_machine.py``; here, what each phase
means for :meth:`MeshCaStore.get` and ``trust_bundle``, the signing records,
the persisted state a restarted replica resumes, and the status section.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mgmt_api.domain import ca_rotation, mesh_ca
from mgmt_api.errors import ApiError, Code
from mgmt_api.service import mesh_ca as store_module
from mgmt_api.service.mesh_ca import MeshCaStore
from mgmt_api.store import repo
from mgmt_api.store.engine import create_engine, migrate, write_tx
from mgmt_api.store.uow import UnitOfWork

ORG, CLUSTER = "o", "c1"
FQN = f"organizations/{ORG}/clusters/{CLUSTER}"
T0 = 2_000_000_000.0
TTL = 3600.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def uow(tmp_path: Path) -> UnitOfWork:
    engine = create_engine(f"sqlite+pysqlite:///{tmp_path / 'db.sqlite'}")
    migrate(engine)
    with write_tx(engine) as conn:
        for fqn, kind in ((f"organizations/{ORG}", "Organization"), (FQN, "Cluster")):
            repo.insert(conn, repo.new_resource(fqn, kind, {}, revision=1, creator="t"))
    return UnitOfWork(engine)


@pytest.fixture
def clock() -> Clock:
    return Clock()


def _serial(ca: mesh_ca.CertificateAuthority) -> int:
    return ca.certificate.serial_number


def _note(store: MeshCaStore, ca: mesh_ca.CertificateAuthority, *instances: str) -> None:
    for instance in instances:
        store.note_signed(ORG, CLUSTER, instance, _serial(ca), store.clock() + TTL)


def test_a_rotation_overlaps_both_cas_until_every_sidecar_is_on_the_new(
    uow: UnitOfWork, clock: Clock
) -> None:
    a, b = MeshCaStore(uow, clock), MeshCaStore(uow, clock)
    old = a.get(ORG, CLUSTER)
    _note(a, old, "s1", "s2")
    revision = uow.current_revision()
    clock.now += 1

    view = a.start(ORG, CLUSTER, "test")
    assert view["phase"] == "trusting" and view["progress"] == {"sidecars": 2, "onNewCa": 0}
    assert uow.current_revision() > revision  # every sidecar stream recompiles
    # Trusting: the old CA signs, both are trusted (the signing one first), on every replica.
    trusting = b.get(ORG, CLUSTER)
    assert trusting.certificate == old.certificate
    new_pem = trusting.also_trusted[0]
    assert b.trust_bundle(ORG, CLUSTER) == (old.certificate_pem, new_pem)
    with pytest.raises(ApiError) as refused:
        b.start(ORG, CLUSTER, "test")
    assert refused.value.code is Code.ABORTED and refused.value.http_status == 409

    # Not yet: the sidecars' certificates predate the phase.
    clock.now += ca_rotation.SETTLE
    assert a.advance_all() == 0
    _note(a, old, "s1", "s2")  # re-issued with the two-CA bundle
    clock.now += ca_rotation.SETTLE
    assert b.advance_all() == 1 and a.advance_all() == 0

    # Signing: the new CA signs; the old one stays trusted. A restarted replica agrees.
    restarted = MeshCaStore(uow, clock)
    signing = restarted.get(ORG, CLUSTER)
    assert signing.certificate_pem == new_pem
    assert restarted.trust_bundle(ORG, CLUSTER) == (new_pem, old.certificate_pem)
    _note(a, signing, "s1")
    clock.now += ca_rotation.SETTLE
    assert a.advance_all() == 0  # s2 still holds a certificate of the old CA
    assert a.view(ORG, CLUSTER)["progress"] == {"sidecars": 2, "onNewCa": 1}
    _note(a, signing, "s2")
    clock.now += ca_rotation.SETTLE
    assert a.advance_all() == 1

    # Done: the old CA left the bundle; the new one is the cluster's CA.
    done = b.get(ORG, CLUSTER)
    assert done.certificate_pem == new_pem and b.trust_bundle(ORG, CLUSTER) == (new_pem,)
    view = b.view(ORG, CLUSTER)
    assert view["phase"] == "done"
    assert view["old"]["fingerprint"] == mesh_ca.fingerprint(old.certificate)
    assert view["new"] == view["signing"]
    assert view["new"]["fingerprint"] == mesh_ca.fingerprint(done.certificate)
    assert view["progress"] == {"sidecars": 2, "onNewCa": 2}
    # And another rotation may start.
    assert a.start(ORG, CLUSTER, "test")["phase"] == "trusting"


def test_trusting_ends_after_a_bounded_wait_and_expired_certificates_do_not_hold_it(
    uow: UnitOfWork, clock: Clock
) -> None:
    store = MeshCaStore(uow, clock)
    old = store.get(ORG, CLUSTER)
    _note(store, old, "gone")  # a sidecar that left: never re-issued
    clock.now += 1
    store.start(ORG, CLUSTER, "test")
    clock.now += ca_rotation.TRUST_WAIT - 1
    assert store.advance_all() == 0
    clock.now += 1
    assert store.advance_all() == 1 and store.view(ORG, CLUSTER)["phase"] == "signing"
    # Its old certificate holds the overlap until it expires.
    clock.now += ca_rotation.SETTLE
    assert store.advance_all() == 0
    clock.now = T0 + TTL
    assert store.advance_all() == 1 and store.view(ORG, CLUSTER)["phase"] == "done"


def test_a_replica_that_read_an_older_phase_does_not_apply_it_again(
    uow: UnitOfWork, clock: Clock
) -> None:
    a, b = MeshCaStore(uow, clock), MeshCaStore(uow, clock)
    a.start(ORG, CLUSTER, "test")
    with uow.read() as conn:
        ((key, seen),) = repo.kv_scan(conn, "mesh-ca/", mesh_ca.ROTATION_SUFFIX)
    clock.now += ca_rotation.SETTLE
    assert a.advance_all() == 1
    assert b._advance(key.removesuffix(mesh_ca.ROTATION_SUFFIX), seen) == 0
    assert a.view(ORG, CLUSTER)["phase"] == "signing"


def test_signing_records_are_bounded(
    uow: UnitOfWork, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "MAX_RECORDS", 3)
    store = MeshCaStore(uow, clock)
    ca = store.get(ORG, CLUSTER)
    _note(store, ca, "s1", "s2", "s3", "s4")  # s4 does not fit
    _note(store, ca, "s1")  # a known instance is updated
    assert store.view(ORG, CLUSTER)["progress"]["sidecars"] == 3
    clock.now += TTL + 1  # every record expired: room again
    _note(store, ca, "s4")
    assert store.view(ORG, CLUSTER)["progress"]["sidecars"] == 1


def test_the_status_of_a_cluster_without_a_ca_yet(uow: UnitOfWork, clock: Clock) -> None:
    assert MeshCaStore(uow, clock).view(ORG, CLUSTER) == {
        "phase": "idle",
        "progress": {"sidecars": 0, "onNewCa": 0},
    }
