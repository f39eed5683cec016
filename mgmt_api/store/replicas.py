"""The replica registry and the periodic jobs' claims (tables of migration 0005).

``replicas``: each mgmt-api replica's row, rewritten on every heartbeat:
its internal address and the clusters whose agent tunnels it holds. A row
whose heartbeat is older than the caller's ``stale_after`` belongs to a
replica that died (kill -9 leaves its row behind) and is skipped.

``periodic_job_runs``: (job, period) is the primary key, so of the replicas
that try to record the same period exactly one insert commits, and that
replica runs the job. Works alike on SQLite (one replica) and PostgreSQL.
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from mgmt_api.store.tables import periodic_job_runs, replicas
from mgmt_api.store.uow import UnitOfWork


def heartbeat(uow: UnitOfWork, replica: str, address: str, clusters: list[str], now: float) -> None:
    """Record (or refresh) this replica's row."""
    values = {"address": address, "clusters": json.dumps(sorted(clusters)), "heartbeat": now}
    with uow.write_rows() as conn:
        updated = conn.execute(
            sa.update(replicas).where(replicas.c.replica_id == replica).values(**values)
        )
        if updated.rowcount == 0:
            conn.execute(sa.insert(replicas).values(replica_id=replica, **values))


def forget(uow: UnitOfWork, replica: str) -> None:
    """Remove this replica's row (a clean shutdown)."""
    with uow.write_rows() as conn:
        conn.execute(sa.delete(replicas).where(replicas.c.replica_id == replica))


def holders(
    uow: UnitOfWork, cluster_fqn: str, *, exclude: str, fresh_since: float
) -> list[tuple[str, str]]:
    """(id, internal address) of the live replicas (other than ``exclude``) holding the
    cluster's tunnel, freshest heartbeat first."""
    query = (
        sa.select(replicas.c.replica_id, replicas.c.address, replicas.c.clusters)
        .where(replicas.c.replica_id != exclude, replicas.c.heartbeat >= fresh_since)
        .order_by(replicas.c.heartbeat.desc())
    )
    with uow.read() as conn:
        rows = conn.execute(query).all()
    return [
        (replica, address)
        for replica, address, clusters in rows
        if cluster_fqn in json.loads(clusters)
    ]


def claim_period(uow: UnitOfWork, job: str, period: int, replica: str, now: float) -> bool:
    """True when this replica is the one to run ``job`` for ``period``."""
    try:
        with uow.write_rows() as conn:
            conn.execute(
                sa.insert(periodic_job_runs).values(
                    job=job, period=period, replica_id=replica, claimed_at=now
                )
            )
    except IntegrityError:
        return False
    return True


def purge_claims(uow: UnitOfWork, job: str, before_period: int) -> None:
    """Drop claims of periods long gone (keeps the table small)."""
    with uow.write_rows() as conn:
        conn.execute(
            sa.delete(periodic_job_runs).where(
                periodic_job_runs.c.job == job, periodic_job_runs.c.period < before_period
            )
        )
