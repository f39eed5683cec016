"""Engine creation, SQLite tuning, transactions and programmatic migrations.

Write transactions on SQLite start with ``BEGIN IMMEDIATE`` so two writers
never both hold a read lock and then deadlock upgrading it; the second one
waits on ``busy_timeout`` instead. WAL lets readers run beside the writer.
``synchronous=NORMAL`` in WAL mode keeps every committed transaction across a
process crash (kill -9); only an OS crash or power loss may lose the last
ones. PostgreSQL is the production store and uses its own durability.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Connection, Engine

MIGRATIONS = Path(__file__).with_name("migrations")
#: libpq's ``connect_timeout`` unless the URL sets one: a PostgreSQL that does not
#: answer (a host gone, a packet filter dropping) fails a connection attempt in
#: seconds instead of the kernel's TCP timeout (minutes), so a request fails
#: fast, a start fails fast (and is restarted), and a drain never waits on it.
POSTGRES_CONNECT_TIMEOUT_SECONDS = 5
_IMMEDIATE = "meshplane_immediate"


def default_sqlite_url(data_dir: str | os.PathLike[str]) -> str:
    path = Path(data_dir).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return f"sqlite+pysqlite:///{path / 'mgmt-api.db'}"


def postgres_connect_args(url: str) -> dict[str, Any]:
    """What every PostgreSQL connection of ours adds to ``url``'s own parameters
    (the pool's, and the replica listener's, :mod:`mgmt_api.store.notify`)."""
    if "connect_timeout" in sa.engine.make_url(url).query:
        return {}
    return {"connect_timeout": POSTGRES_CONNECT_TIMEOUT_SECONDS}


def create_engine(url: str) -> Engine:
    """An engine for ``url`` with the per-dialect settings described above."""
    if url.startswith("sqlite"):
        engine = sa.create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            pool_size=16,
            max_overflow=16,
        )

        @sa.event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @sa.event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            immediate = conn.get_execution_options().get(_IMMEDIATE, False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

        return engine
    if url.startswith("postgresql"):
        # No pool_pre_ping: it adds a round trip to every checkout (two per
        # request). Connections are recycled instead, and a connection that
        # died under us fails that one request, not the process.
        return sa.create_engine(
            url,
            pool_size=16,
            max_overflow=16,
            pool_recycle=1800,
            connect_args=postgres_connect_args(url),
        )
    raise ValueError(f"unsupported database URL scheme: {url.split(':', 1)[0]}")


@contextmanager
def read_tx(engine: Engine) -> Iterator[Connection]:
    with engine.connect() as conn, conn.begin():
        yield conn


@contextmanager
def write_tx(engine: Engine) -> Iterator[Connection]:
    with engine.connect() as raw:
        conn = raw.execution_options(**{_IMMEDIATE: True})
        with conn.begin():
            yield conn


def migrate(engine: Engine) -> None:
    """Upgrade the schema to the newest revision shipped with the package."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            # Serialise concurrent starters (several replicas) on one lock.
            conn.exec_driver_sql("SELECT pg_advisory_lock(7344010)")
        try:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
            conn.commit()
        finally:
            if engine.dialect.name == "postgresql":
                conn.exec_driver_sql("SELECT pg_advisory_unlock(7344010)")
                conn.commit()
