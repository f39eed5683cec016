"""The replica registry and job claims on the real schema (SQLite here; PostgreSQL in
``test_proxytools_any_replica.py``): stale rows and this replica's own row are skipped,
a period is claimed once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mgmt_api.store import replicas as registry
from mgmt_api.store.engine import create_engine, migrate
from mgmt_api.store.uow import UnitOfWork

CLUSTER = "organizations/o/clusters/a"
NOW = 1_800_000_000.0


@pytest.fixture
def uow(tmp_path: Path) -> Iterator[UnitOfWork]:
    engine = create_engine(f"sqlite+pysqlite:///{tmp_path / 'mgmt-api.db'}")
    migrate(engine)
    try:
        yield UnitOfWork(engine)
    finally:
        engine.dispose()


def test_holders_are_the_live_other_replicas_holding_the_cluster(uow: UnitOfWork) -> None:
    registry.heartbeat(uow, "self", "http://self", [CLUSTER], NOW)
    registry.heartbeat(uow, "dead", "http://dead", [CLUSTER], NOW - 60)
    registry.heartbeat(uow, "old", "http://old", [CLUSTER], NOW - 2)
    registry.heartbeat(uow, "new", "http://new", [CLUSTER], NOW - 1)
    registry.heartbeat(uow, "none", "http://none", ["organizations/o/clusters/b"], NOW)
    assert registry.holders(uow, CLUSTER, exclude="self", fresh_since=NOW - 6) == [
        ("new", "http://new"),
        ("old", "http://old"),
    ]


def test_a_heartbeat_rewrites_the_row_and_forget_removes_it(uow: UnitOfWork) -> None:
    registry.heartbeat(uow, "r1", "http://r1", [CLUSTER], NOW)
    registry.heartbeat(uow, "r1", "http://r1", [], NOW + 2)  # the tunnel closed
    assert registry.holders(uow, CLUSTER, exclude="x", fresh_since=NOW) == []
    registry.heartbeat(uow, "r1", "http://r1", [CLUSTER], NOW + 4)
    registry.forget(uow, "r1")
    assert registry.holders(uow, CLUSTER, exclude="x", fresh_since=0) == []


def test_a_period_is_claimed_once(uow: UnitOfWork) -> None:
    assert registry.claim_period(uow, "job", 7, "r1", NOW)
    assert not registry.claim_period(uow, "job", 7, "r2", NOW)
    assert registry.claim_period(uow, "job", 8, "r2", NOW)
    assert registry.claim_period(uow, "other", 7, "r2", NOW)
    registry.purge_claims(uow, "job", 8)
    assert registry.claim_period(uow, "job", 7, "r1", NOW)  # purged: claimable again
