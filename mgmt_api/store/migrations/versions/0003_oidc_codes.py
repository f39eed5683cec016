"""Identity: one-time login codes (RFC 8252 loopback logins) and the used-token cache.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "oidc_login_codes",
        sa.Column("code_hash", sa.String(64), primary_key=True),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
    )
    op.create_index("ix_oidc_login_codes_expires_at", "oidc_login_codes", ["expires_at"])
    op.create_table(
        "oidc_used_tokens",
        sa.Column("token_key", sa.String(64), primary_key=True),
        sa.Column("expires_at", sa.Float, nullable=False),
    )
    op.create_index("ix_oidc_used_tokens_expires_at", "oidc_used_tokens", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_oidc_used_tokens_expires_at", "oidc_used_tokens")
    op.drop_table("oidc_used_tokens")
    op.drop_index("ix_oidc_login_codes_expires_at", "oidc_login_codes")
    op.drop_table("oidc_login_codes")
