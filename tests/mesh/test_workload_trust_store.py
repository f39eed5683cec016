"""The attestation's read model over a real (SQLite) store: what it caches and when it rereads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mgmt_api.service import workload_trust
from mgmt_api.service.enforcement import UnknownCluster
from mgmt_api.service.workload_trust import WorkloadTrustStore
from mgmt_api.store import repo
from mgmt_api.store.engine import create_engine, migrate, write_tx
from mgmt_api.store.uow import UnitOfWork

ORG = "o"


def _fqn(cluster: str) -> str:
    return f"organizations/{ORG}/clusters/{cluster}"


def _pods(*names: str) -> dict[str, Any]:
    return {"namespaces": [{"name": "ns", "pods": [{"name": n, "uid": n} for n in names]}]}


def _report(uow: UnitOfWork, cluster: str, status: dict[str, Any]) -> None:
    """What a report on another replica does: the row changes, nobody here is told."""
    with write_tx(uow.engine) as conn:
        res = repo.get(conn, _fqn(cluster))
        assert res is not None
        repo.set_status(conn, res.fqn, status, res.etag)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def uow(tmp_path: Path) -> UnitOfWork:
    engine = create_engine(f"sqlite+pysqlite:///{tmp_path / 'db.sqlite'}")
    migrate(engine)
    with write_tx(engine) as conn:
        repo.insert(
            conn,
            repo.new_resource(f"organizations/{ORG}", "Organization", {}, revision=1, creator="t"),
        )
        for name in ("a", "b", "c"):
            repo.insert(conn, repo.new_resource(_fqn(name), "Cluster", {}, revision=1, creator="t"))
    return UnitOfWork(engine)


def test_cached_until_the_next_report_here_or_for_its_age(uow: UnitOfWork) -> None:
    clock = Clock()
    store = WorkloadTrustStore(uow, clock)
    _report(uow, "a", _pods("p1"))
    assert set(store.get(ORG, "a").pods) == {("ns", "p1")}
    _report(uow, "a", _pods("p2"))  # stored by another replica
    assert set(store.get(ORG, "a").pods) == {("ns", "p1")}  # still the cached copy
    clock.now += workload_trust.MAX_AGE_SECONDS
    assert set(store.get(ORG, "a").pods) == {("ns", "p2")}  # aged out: reread
    _report(uow, "a", _pods("p3"))
    store.reported(_fqn("a"))  # this replica stored it
    assert set(store.get(ORG, "a").pods) == {("ns", "p3")}
    _report(uow, "a", _pods("p4"))
    uow.listeners.committed(7)  # any write committed here
    assert set(store.get(ORG, "a").pods) == {("ns", "p4")}


def test_an_unknown_cluster_and_the_pod_bound(
    uow: UnitOfWork, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = WorkloadTrustStore(uow, Clock())
    with pytest.raises(UnknownCluster):
        store.get(ORG, "nope")
    monkeypatch.setattr(workload_trust, "MAX_CACHED_PODS", 3)
    _report(uow, "a", _pods("a1", "a2"))
    _report(uow, "b", _pods("b1", "b2"))
    _report(uow, "c", _pods("c1", "c2", "c3", "c4"))  # more than the bound: never kept
    store.get(ORG, "a")
    store.get(ORG, "b")  # 4 pods: a is dropped
    store.get(ORG, "c")
    assert list(store._cache) == [_fqn("b")]
