"""Clusters' ``rateLimit.backend.redis.url``: stored as the URL it means.

Spec 2.9 writes the URL as ``<host>:<port>``. Releases before this one stored
it as written and turned it into ``redis://<host>:<port>`` each time a
snapshot was compiled; now the API stores the URL itself, so every reader
(snapshots, ``.../config``, the gateway config) sees one form. This rewrites
the rows written the old way. Downgrading leaves them as URLs, which the old
readers accept too.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_resources = sa.table(
    "resources",
    sa.column("fqn", sa.String),
    sa.column("kind", sa.String),
    sa.column("spec", sa.Text),
)


def upgrade() -> None:
    conn = op.get_bind()
    rows = conn.execute(
        sa.select(_resources.c.fqn, _resources.c.spec).where(_resources.c.kind == "Cluster")
    )
    for fqn, text in rows.fetchall():
        spec = json.loads(text)
        redis = ((spec.get("rateLimit") or {}).get("backend") or {}).get("redis") or {}
        url = redis.get("url")
        if isinstance(url, str) and "://" not in url:
            redis["url"] = f"redis://{url}"
            conn.execute(
                sa.update(_resources)
                .where(_resources.c.fqn == fqn)
                .values(spec=json.dumps(spec, separators=(",", ":"), sort_keys=True))
            )


def downgrade() -> None:
    """Nothing to undo: the old readers accept full URLs."""
