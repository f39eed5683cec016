"""Table definitions, mirrored by the Alembic migrations in ``migrations/``.

One generic ``resources`` table keyed by FQN holds every kind: the parent FQN
and kind columns serve listing, the byte-ordered FQN primary key serves the
subtree range scans of recursive delete, and the JSON ``spec`` keeps kinds
added later migration-free. Side tables (policies, keys,
credentials) are keyed by the owning FQN so the same range delete removes them.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

# "C" collation on PostgreSQL so FQN order is byte order (see fqn.subtree_bounds).
FqnType = sa.String(512).with_variant(sa.String(512, collation="C"), "postgresql")

resources = sa.Table(
    "resources",
    metadata,
    sa.Column("fqn", FqnType, primary_key=True),
    sa.Column("parent", FqnType, nullable=False),
    sa.Column("kind", sa.String(64), nullable=False),
    sa.Column("name", sa.String(63), nullable=False),
    sa.Column("spec", sa.Text, nullable=False),
    sa.Column("status", sa.Text, nullable=False, server_default="{}"),
    sa.Column("etag", sa.String(64), nullable=False),
    sa.Column("protected", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("creator", sa.String(512), nullable=False, server_default=""),
    sa.Column("create_time", sa.BigInteger, nullable=False),
    sa.Column("update_time", sa.BigInteger, nullable=False),
    sa.Index("ix_resources_parent_kind_fqn", "parent", "kind", "fqn"),
)

policies = sa.Table(
    "policies",
    metadata,
    sa.Column("fqn", FqnType, primary_key=True),
    sa.Column("allow", sa.Text, nullable=False),
    sa.Column("description", sa.Text, nullable=False, server_default=""),
    sa.Column("etag", sa.String(64), nullable=False),
    sa.Column("update_time", sa.BigInteger, nullable=False),
)

sa_keys = sa.Table(
    "sa_keys",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("owner", FqnType, nullable=False, index=True),
    sa.Column("public_jwk", sa.Text, nullable=False),
    sa.Column("create_time", sa.BigInteger, nullable=False),
)

credentials = sa.Table(
    "credentials",
    metadata,
    sa.Column("fqn", FqnType, primary_key=True),
    sa.Column("password_hash", sa.Text, nullable=False),
)

audit_log = sa.Table(
    "audit_log",
    metadata,
    sa.Column(
        "id",
        sa.BigInteger().with_variant(sa.Integer, "sqlite"),
        primary_key=True,
        autoincrement=True,
    ),
    sa.Column("organization", sa.String(128), nullable=False, server_default=""),
    sa.Column("fqn", FqnType, nullable=False),
    sa.Column("kind", sa.String(64), nullable=False),
    sa.Column("operation", sa.String(64), nullable=False),
    sa.Column("actor", sa.String(512), nullable=False),
    sa.Column("time", sa.BigInteger, nullable=False),
    sa.Column("message", sa.Text, nullable=False),
    sa.Column("properties", sa.Text, nullable=False, server_default="{}"),
    sa.Index("ix_audit_org_id", "organization", "id"),
)

# Single-row counter bumped by every write transaction (watchers of later
# issues wait on it) and a small key/value table for server secrets.
revision = sa.Table(
    "revision",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("value", sa.BigInteger, nullable=False),
)

server_kv = sa.Table(
    "server_kv",
    metadata,
    sa.Column("key", sa.String(128), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)

# ---- identity (migration 0002) ----------------------------------------------

# Pending OIDC logins, keyed by ``state``: shared by every replica, so a
# callback may land on another process than the login (mgmt_api.identity.sql_store).
login_states = sa.Table(
    "login_states",
    metadata,
    sa.Column("state", sa.String(128), primary_key=True),
    sa.Column("payload", sa.Text, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Index("ix_login_states_expires_at", "expires_at"),
)

# The last directory-sync result of each organization (and its last success).
directory_sync_runs = sa.Table(
    "directory_sync_runs",
    metadata,
    sa.Column("organization", sa.String(128), primary_key=True),
    sa.Column("last_result", sa.Text, nullable=False),
    sa.Column("last_success", sa.Text, nullable=True),
    sa.Column("update_time", sa.BigInteger, nullable=False),
)

# ---- identity (migration 0003) ----------------------------------------------

# One-time codes that hand a finished browser login to a native client (RFC 8252),
# keyed by the code's SHA-256 (mgmt_api.identity.login_code).
oidc_login_codes = sa.Table(
    "oidc_login_codes",
    metadata,
    sa.Column("code_hash", sa.String(64), primary_key=True),
    sa.Column("payload", sa.Text, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Index("ix_oidc_login_codes_expires_at", "expires_at"),
)

# Provider tokens already traded for a platform token (device login, token exchange),
# kept until they expire so each one is used once.
oidc_used_tokens = sa.Table(
    "oidc_used_tokens",
    metadata,
    sa.Column("token_key", sa.String(64), primary_key=True),
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Index("ix_oidc_used_tokens_expires_at", "expires_at"),
)

# ---- replicas (migration 0005) ----------------------------------------------

# Each mgmt-api replica's internal address and the clusters whose agent tunnels
# it holds, refreshed by its heartbeat (mgmt_api.store.replicas).
replicas = sa.Table(
    "replicas",
    metadata,
    sa.Column("replica_id", sa.String(64), primary_key=True),
    sa.Column("address", sa.String(512), nullable=False),
    sa.Column("clusters", sa.Text, nullable=False),
    sa.Column("heartbeat", sa.Float, nullable=False),
)

# One row per (periodic job, period): the replica whose insert committed ran it.
periodic_job_runs = sa.Table(
    "periodic_job_runs",
    metadata,
    sa.Column("job", sa.String(128), primary_key=True),
    sa.Column("period", sa.BigInteger, primary_key=True),
    sa.Column("replica_id", sa.String(64), nullable=False),
    sa.Column("claimed_at", sa.Float, nullable=False),
)

# The mesh's endpoint registry: every connected sidecar, whichever replica holds
# its stream (mgmt_api.store.sidecars).
mesh_sidecars = sa.Table(
    "mesh_sidecars",
    metadata,
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
    sa.Index("ix_mesh_sidecars_stream", "stream"),
    sa.Index("ix_mesh_sidecars_heard", "heard"),
)
