"""Identity: pending OIDC logins and the last directory-sync result per organization.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "login_states",
        sa.Column("state", sa.String(128), primary_key=True),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
    )
    op.create_index("ix_login_states_expires_at", "login_states", ["expires_at"])
    op.create_table(
        "directory_sync_runs",
        sa.Column("organization", sa.String(128), primary_key=True),
        sa.Column("last_result", sa.Text, nullable=False),
        sa.Column("last_success", sa.Text, nullable=True),
        sa.Column("update_time", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("directory_sync_runs")
    op.drop_index("ix_login_states_expires_at", "login_states")
    op.drop_table("login_states")
