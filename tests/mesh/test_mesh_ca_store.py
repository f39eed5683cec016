"""Where each cluster's mesh CA is kept: a real (SQLite) store shared by two "replicas"."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from mgmt_api.domain import mesh_ca
from mgmt_api.service.enforcement import UnknownCluster
from mgmt_api.service.mesh_ca import MeshCaStore
from mgmt_api.store import repo
from mgmt_api.store.engine import create_engine, migrate, write_tx
from mgmt_api.store.uow import UnitOfWork

ORG, CLUSTER = "o", "c1"
FQN = f"organizations/{ORG}/clusters/{CLUSTER}"


def _cluster(engine: Any, spec: dict[str, Any], create_time: int | None = None) -> None:
    with write_tx(engine) as conn:
        repo.delete_subtree(conn, FQN)
        res = repo.new_resource(FQN, "Cluster", spec, revision=1, creator="test")
        if create_time is not None:
            res = dataclasses.replace(res, create_time=create_time)
        repo.insert(conn, res)


@pytest.fixture
def uow(tmp_path: Path) -> UnitOfWork:
    engine = create_engine(f"sqlite+pysqlite:///{tmp_path / 'db.sqlite'}")
    migrate(engine)
    with write_tx(engine) as conn:
        repo.insert(
            conn,
            repo.new_resource(f"organizations/{ORG}", "Organization", {}, revision=1, creator="t"),
        )
    _cluster(engine, {})
    return UnitOfWork(engine)


def _stored(uow: UnitOfWork) -> int:
    with uow.read() as conn:
        return sum(
            1 for _ in conn.exec_driver_sql("SELECT key FROM server_kv WHERE key LIKE 'mesh-ca/%'")
        )


def test_replicas_share_one_ca_per_cluster_and_trust_domain(uow: UnitOfWork) -> None:
    a, b = MeshCaStore(uow), MeshCaStore(uow)
    first = a.get(ORG, CLUSTER)
    assert first.trust_domain == f"{CLUSTER}.{ORG}.mesh.local"
    assert b.get(ORG, CLUSTER).certificate == first.certificate
    assert _stored(uow) == 1
    # A new trust domain: a new CA of it.
    _cluster(uow.engine, {"trustDomain": "prod.example"}, create_time=_create_time(uow))
    moved = b.get(ORG, CLUSTER)
    assert moved.trust_domain == "prod.example" and moved.certificate != first.certificate
    # The cluster recreated under the same name and trust domain: never the old CA.
    _cluster(uow.engine, {"trustDomain": "prod.example"}, create_time=_create_time(uow) + 1)
    assert a.get(ORG, CLUSTER).certificate not in (first.certificate, moved.certificate)


def _create_time(uow: UnitOfWork) -> int:
    with uow.read() as conn:
        res = repo.get(conn, FQN)
    assert res is not None
    return res.create_time


def test_a_replica_that_loses_the_race_to_create_takes_the_winners(uow: UnitOfWork) -> None:
    winner = MeshCaStore(uow).get(ORG, CLUSTER)
    key = mesh_ca.store_key(FQN, _create_time(uow), winner.trust_domain)
    # The loser read no CA, made its own, and its insert meets the winner's row.
    stored = MeshCaStore(uow)._create(key, winner.trust_domain)
    assert json.loads(stored)["cert"] == winner.certificate_pem and _stored(uow) == 1


def test_a_deleted_cluster_has_no_ca(uow: UnitOfWork) -> None:
    # (Its stored CAs go in the deleting transaction: tests/mgmt_api/test_delete.py.)
    with write_tx(uow.engine) as conn:
        repo.delete_subtree(conn, FQN)
    with pytest.raises(UnknownCluster):
        MeshCaStore(uow).get(ORG, CLUSTER)
