"""Migration 0006: a cluster's agent loses the ``rbac/editor`` binding earlier releases gave it.

A real SQLite database is brought to revision 0005 (the schema before), given
the policies an earlier release wrote, and upgraded: the agent leaves its own
cluster's ``rbac/editor`` bindings, everything else stays as it was.
"""

from __future__ import annotations

import json
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from mgmt_api.store import tables
from mgmt_api.store.engine import MIGRATIONS, create_engine, migrate

CLUSTER = "organizations/o/clusters/c"
AGENT = {"serviceAccount": f"{CLUSTER}/serviceaccounts/agent"}
ALICE = {"user": "organizations/o/users/alice"}


def _insert(conn: sa.Connection, fqn: str, allow: list[dict[str, object]]) -> None:
    conn.execute(
        sa.insert(tables.policies).values(
            fqn=fqn, allow=json.dumps(allow), description="", etag='"old"', update_time=0
        )
    )


def test_the_upgrade_removes_the_agents_own_binding_only(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite+pysqlite:///{tmp_path / 'old.db'}")
    try:
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        with engine.connect() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0005")
            conn.commit()
        with engine.begin() as conn:
            _insert(
                conn,
                CLUSTER,
                [
                    {"role": "rbac/admin", "subjects": [ALICE]},
                    {"role": "rbac/editor", "subjects": [AGENT]},
                ],
            )
            # shared with a user: the user keeps the binding
            _insert(
                conn,
                "organizations/o/clusters/d",
                [
                    {
                        "role": "rbac/editor",
                        "subjects": [
                            {"serviceAccount": "organizations/o/clusters/d/serviceaccounts/agent"},
                            ALICE,
                        ],
                    }
                ],
            )
            # bound by an admin elsewhere on purpose: not the migration's to remove
            _insert(conn, "organizations/o", [{"role": "rbac/reader", "subjects": [AGENT]}])
        migrate(engine)
        with engine.connect() as conn:
            got = {
                r.fqn: (json.loads(r.allow), r.etag)
                for r in conn.execute(sa.select(tables.policies))
            }
        assert got[CLUSTER][0] == [{"role": "rbac/admin", "subjects": [ALICE]}]
        assert got[CLUSTER][1] != '"old"'  # a new etag: readers see the change
        assert got["organizations/o/clusters/d"][0] == [
            {"role": "rbac/editor", "subjects": [ALICE]}
        ]
        assert got["organizations/o"] == (
            [{"role": "rbac/reader", "subjects": [AGENT]}],
            '"old"',
        )
    finally:
        engine.dispose()
