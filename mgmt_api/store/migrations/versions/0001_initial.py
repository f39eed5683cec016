"""Initial schema: resources, policies, service-account keys, credentials, audit.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

FQN = sa.String(512).with_variant(sa.String(512, collation="C"), "postgresql")


def upgrade() -> None:
    op.create_table(
        "resources",
        sa.Column("fqn", FQN, primary_key=True),
        sa.Column("parent", FQN, nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default="{}"),
        sa.Column("etag", sa.String(64), nullable=False),
        sa.Column("protected", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("creator", sa.String(512), nullable=False, server_default=""),
        sa.Column("create_time", sa.BigInteger, nullable=False),
        sa.Column("update_time", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_resources_parent_kind_fqn", "resources", ["parent", "kind", "fqn"])
    op.create_table(
        "policies",
        sa.Column("fqn", FQN, primary_key=True),
        sa.Column("allow", sa.Text, nullable=False),
        sa.Column("description", sa.Text, nullable=False, server_default=""),
        sa.Column("etag", sa.String(64), nullable=False),
        sa.Column("update_time", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "sa_keys",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("owner", FQN, nullable=False),
        sa.Column("public_jwk", sa.Text, nullable=False),
        sa.Column("create_time", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_sa_keys_owner", "sa_keys", ["owner"])
    op.create_table(
        "credentials",
        sa.Column("fqn", FQN, primary_key=True),
        sa.Column("password_hash", sa.Text, nullable=False),
    )
    op.create_table(
        "audit_log",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer, "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("organization", sa.String(128), nullable=False, server_default=""),
        sa.Column("fqn", FQN, nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("operation", sa.String(64), nullable=False),
        sa.Column("actor", sa.String(512), nullable=False),
        sa.Column("time", sa.BigInteger, nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("properties", sa.Text, nullable=False, server_default="{}"),
    )
    op.create_index("ix_audit_org_id", "audit_log", ["organization", "id"])
    op.create_table(
        "revision",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("value", sa.BigInteger, nullable=False),
    )
    op.execute("INSERT INTO revision (id, value) VALUES (1, 0)")
    op.create_table(
        "server_kv",
        sa.Column("key", sa.String(128), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )


def downgrade() -> None:
    for table in ("server_kv", "revision", "audit_log", "credentials", "sa_keys", "policies"):
        op.drop_table(table)
    op.drop_index("ix_resources_parent_kind_fqn", "resources")
    op.drop_table("resources")
