"""A cluster's agent account holds no role on its cluster.

Releases before this one bound ``rbac/editor`` on each cluster to its agent
account (``{cluster}/serviceaccounts/agent``), so a stolen agent key could
write the cluster's config over REST. What the cluster's accounts may do is
now the table of ``mgmt_api.domain.cluster_accounts`` (the agent: its tunnel
and its inventory report), and none of them holds a role: this removes the
agent from the ``rbac/editor`` bindings of its own cluster's policy (a
binding left with no subject goes) and gives the policy a new etag.
Downgrading does not bring the bindings back: an older release checks the
agent's inventory reports against that role, so bind it again by hand
there.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-28
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_policies = sa.table(
    "policies",
    sa.column("fqn", sa.String),
    sa.column("allow", sa.Text),
    sa.column("etag", sa.String),
)
_AGENT_ROLE = "rbac/editor"


def _is_cluster(fqn: str) -> bool:
    parts = fqn.split("/")
    return len(parts) == 4 and parts[0] == "organizations" and parts[2] == "clusters"


def without_agent(fqn: str, allow: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``allow`` without the cluster's agent in its ``rbac/editor`` bindings."""
    agent = {"serviceAccount": f"{fqn}/serviceaccounts/agent"}
    out = []
    for binding in allow:
        if binding.get("role") != _AGENT_ROLE:
            out.append(binding)
            continue
        subjects = [s for s in binding.get("subjects") or [] if s != agent]
        if subjects:
            out.append({**binding, "subjects": subjects})
    return out


def upgrade() -> None:
    conn = op.get_bind()
    rows = conn.execute(sa.select(_policies.c.fqn, _policies.c.allow))
    for fqn, text in rows.fetchall():
        if not _is_cluster(fqn):
            continue
        allow = json.loads(text)
        kept = without_agent(fqn, allow)
        if kept == allow:
            continue
        digest = hashlib.blake2b(f"{fqn}#policy\x000006".encode(), digest_size=8).hexdigest()
        conn.execute(
            sa.update(_policies)
            .where(_policies.c.fqn == fqn)
            .values(
                allow=json.dumps(kept, separators=(",", ":"), sort_keys=True), etag=f'"{digest}"'
            )
        )


def downgrade() -> None:
    """The bindings are not restored (see above)."""
