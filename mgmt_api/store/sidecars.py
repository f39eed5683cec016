"""The mesh's endpoint registry: one row per connected sidecar, shared by every replica.

A service's endpoints are the rows of its sidecars, whichever replica holds
their streams, so every replica serves every sidecar the same view and a
restarted replica serves them at once (``mesh_sidecars``, migration 0007).
What moves a row (:mod:`mgmt_api.service.sidecars` decides when):

- :func:`join`: a stream was admitted. The row is (re)written with the
  stream's token, so a reconnect on another replica owns it from then on;
- :func:`leave`: that stream's client went away. Deletes the row only while
  the stream still owns it (a late leave of a replaced stream is a no-op);
- :func:`refresh`: the holding replica still has these streams (``heard``);
- :func:`sweep`: rows unheard since a cut-off (their replica died, and the
  sidecar has not come back anywhere) are deleted.

None of them is a configuration revision (nothing else compiles from these
rows): they do not bump the revision, so they wake neither the gateways nor
the policy streams. Joins, leaves and sweeps that delete return True, and on
PostgreSQL send ``NOTIFY meshplane_sidecars`` with their commit, which every
replica's sidecar streams follow (:mod:`mgmt_api.store.notify`); the caller
wakes its own replica's. Refreshes change no endpoint and notify nobody.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import sqlalchemy as sa

from mgmt_api.compiler.sidecar_xds import SidecarEndpoint
from mgmt_api.store.notify import SIDECARS_CHANNEL
from mgmt_api.store.tables import mesh_sidecars
from mgmt_api.store.uow import UnitOfWork

#: Streams refreshed per statement (keeps each IN list bounded).
_CHUNK = 500
_NOTIFY = sa.text(f"SELECT pg_notify('{SIDECARS_CHANNEL}', '1')")


def _notify(conn: sa.Connection) -> None:
    """Tell the other replicas, when this transaction commits (PostgreSQL only)."""
    if conn.dialect.name == "postgresql":
        conn.execute(_NOTIFY)


@dataclass(frozen=True)
class SidecarRow:
    """One connected sidecar as the registry holds it."""

    organization: str
    cluster: str
    instance: str
    endpoint: SidecarEndpoint
    pod: str  # the verified pod, "NS/NAME/UID"
    stream: str  # the owning stream's token
    replica: str


def join(uow: UnitOfWork, row: SidecarRow, now: float) -> None:
    """Record a newly admitted stream; it owns the instance's row from now on."""
    key = _key(row.organization, row.cluster, row.instance)
    e = row.endpoint
    with uow.write_rows() as conn:
        conn.execute(sa.delete(mesh_sidecars).where(*key))
        conn.execute(
            sa.insert(mesh_sidecars).values(
                organization=row.organization,
                cluster=row.cluster,
                instance=row.instance,
                namespace=e.namespace,
                service=e.service,
                host=e.host,
                port=e.port,
                service_account=e.service_account,
                pod=row.pod,
                stream=row.stream,
                replica_id=row.replica,
                heard=now,
            )
        )
        _notify(conn)


def leave(uow: UnitOfWork, organization: str, cluster: str, instance: str, stream: str) -> bool:
    """Drop the instance's row if ``stream`` still owns it; whether it did."""
    query = sa.select(mesh_sidecars.c.stream).where(*_key(organization, cluster, instance))
    with uow.read() as conn:
        if conn.execute(query).scalar() != stream:
            return False
    with uow.write_rows() as conn:
        deleted = conn.execute(
            sa.delete(mesh_sidecars).where(
                *_key(organization, cluster, instance), mesh_sidecars.c.stream == stream
            )
        ).rowcount
        if deleted:
            _notify(conn)
    return bool(deleted)


def refresh(uow: UnitOfWork, streams: Iterable[str], now: float) -> None:
    """These streams are still open here: their rows were heard from at ``now``."""
    tokens = sorted(streams)
    if not tokens:
        return
    with uow.write_rows() as conn:
        for start in range(0, len(tokens), _CHUNK):
            chunk = tokens[start : start + _CHUNK]
            conn.execute(
                sa.update(mesh_sidecars).where(mesh_sidecars.c.stream.in_(chunk)).values(heard=now)
            )


def sweep(uow: UnitOfWork, unheard_since: float) -> int:
    """Delete rows not heard from since ``unheard_since``; how many."""
    stale = mesh_sidecars.c.heard < unheard_since
    with uow.read() as conn:
        if conn.execute(sa.select(sa.func.count()).where(stale)).scalar_one() == 0:
            return 0
    with uow.write_rows() as conn:
        deleted = int(conn.execute(sa.delete(mesh_sidecars).where(stale)).rowcount or 0)
        if deleted:
            _notify(conn)
    return deleted


def endpoints(uow: UnitOfWork, organization: str, cluster: str) -> tuple[SidecarEndpoint, ...]:
    """The cluster's registered sidecars as endpoints, sorted, one per address."""
    c = mesh_sidecars.c
    columns = (c.namespace, c.service, c.host, c.port, c.service_account)
    query = (
        sa.select(*columns)
        .where(c.organization == organization, c.cluster == cluster)
        .order_by(*columns)
    )
    with uow.read() as conn:
        rows = conn.execute(query).all()
    # Sorted by the store (the endpoints' own order), duplicates dropped.
    return tuple(SidecarEndpoint(*row) for row in dict.fromkeys(tuple(r) for r in rows))


def instances(
    uow: UnitOfWork, organization: str, cluster: str, namespace: str, service: str
) -> tuple[str, ...]:
    """The connected sidecars (instances, sorted) of ``service`` in ``namespace``."""
    c = mesh_sidecars.c
    query = (
        sa.select(c.instance)
        .where(
            c.organization == organization,
            c.cluster == cluster,
            c.namespace == namespace,
            c.service == service,
        )
        .order_by(c.instance)
    )
    with uow.read() as conn:
        return tuple(str(row[0]) for row in conn.execute(query))


@dataclass(frozen=True)
class RegisteredSidecar:
    """A registry row as people see it (the workloads view): no stream token."""

    instance: str
    endpoint: SidecarEndpoint
    pod: str
    replica: str
    heard: float


def registered(uow: UnitOfWork, organization: str, cluster: str) -> list[RegisteredSidecar]:
    """The cluster's registered sidecars, by instance."""
    c = mesh_sidecars.c
    query = (
        sa.select(
            c.instance,
            c.namespace,
            c.service,
            c.host,
            c.port,
            c.service_account,
            c.pod,
            c.replica_id,
            c.heard,
        )
        .where(c.organization == organization, c.cluster == cluster)
        .order_by(c.instance)
    )
    with uow.read() as conn:
        rows = conn.execute(query).all()
    return [
        RegisteredSidecar(r[0], SidecarEndpoint(*r[1:6]), r[6], r[7], float(r[8])) for r in rows
    ]


def count(uow: UnitOfWork, organization: str, cluster: str) -> int:
    """How many sidecars the cluster has registered (the per-cluster cap reads it)."""
    c = mesh_sidecars.c
    query = sa.select(sa.func.count()).where(c.organization == organization, c.cluster == cluster)
    with uow.read() as conn:
        return int(conn.execute(query).scalar_one())


def _key(organization: str, cluster: str, instance: str) -> tuple[sa.ColumnElement[bool], ...]:
    c = mesh_sidecars.c
    return (c.organization == organization, c.cluster == cluster, c.instance == instance)
