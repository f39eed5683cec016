"""The mesh's endpoint registry: connected sidecars, shared by every replica.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "mesh_sidecars",
        sa.Column("organization", sa.String(128), primary_key=True),
        sa.Column("cluster", sa.String(128), primary_key=True),
        sa.Column("instance", sa.String(256), primary_key=True),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("service", sa.String(253), nullable=False),
        sa.Column("host", sa.String(256), nullable=False),
        sa.Column("port", sa.Integer, nullable=False),
        sa.Column("service_account", sa.String(253), nullable=False),
        sa.Column("pod", sa.String(600), nullable=False),
        sa.Column("stream", sa.String(64), nullable=False),
        sa.Column("replica_id", sa.String(64), nullable=False),
        sa.Column("heard", sa.Float, nullable=False),
    )
    op.create_index("ix_mesh_sidecars_stream", "mesh_sidecars", ["stream"])
    op.create_index("ix_mesh_sidecars_heard", "mesh_sidecars", ["heard"])


def downgrade() -> None:
    op.drop_index("ix_mesh_sidecars_heard", "mesh_sidecars")
    op.drop_index("ix_mesh_sidecars_stream", "mesh_sidecars")
    op.drop_table("mesh_sidecars")
