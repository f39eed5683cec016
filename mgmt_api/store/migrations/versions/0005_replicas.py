"""Replicas: the replica registry (who holds which agent tunnel) and periodic job claims.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "replicas",
        sa.Column("replica_id", sa.String(64), primary_key=True),
        sa.Column("address", sa.String(512), nullable=False),
        sa.Column("clusters", sa.Text, nullable=False),
        sa.Column("heartbeat", sa.Float, nullable=False),
    )
    op.create_table(
        "periodic_job_runs",
        sa.Column("job", sa.String(128), primary_key=True),
        sa.Column("period", sa.BigInteger, primary_key=True),
        sa.Column("replica_id", sa.String(64), nullable=False),
        sa.Column("claimed_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("periodic_job_runs")
    op.drop_table("replicas")
