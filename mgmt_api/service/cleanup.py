"""``POST /v2/organizations/{org}/cleanupresources``: find and delete unused objects.

Unused, within one organization:

1. the onboarding tenant and workspace when no onboarding config of any of
   the organization's clusters onboards a namespace (and they hold nothing
   else);
2. profiles attached to no organization, tenant or workspace;
3. security groups whose namespace selector (their own, else their
   workspace's) matches no namespace any of the organization's agents reported;
4. service-account keys whose owner lives under a cluster that no longer
   exists (deleting a cluster revokes its keys in the same transaction, so
   these are leftovers of imports, restores or older releases).

Candidates are found and, with ``apply``, deleted in one transaction, so the
applied set is exactly what a dry run on the same state lists. Protected
objects (``deletionProtectionEnabled``) and objects that still hold children
are skipped and reported, never deleted. The operation has its own
permission: READ (dry run) or DELETE (apply) for kind ``CleanupResources`` on
the organization, so a role can grant cleanup without granting deletes of
every kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from mgmt_api import fqn as fqnmod
from mgmt_api.domain import lookup, rbac
from mgmt_api.domain import onboarding as ob
from mgmt_api.errors import not_found
from mgmt_api.service import authz
from mgmt_api.service.onboarding_sync import OnboardingNames, config_of
from mgmt_api.service.profiles import PROFILE_LEVELS, all_children
from mgmt_api.service.resources import CallContext, ResourceService
from mgmt_api.store import repo
from mgmt_api.store.engine import read_tx, write_tx
from mgmt_api.store.tables import sa_keys

audit = ResourceService._audit  # the audit record every resource write makes

KIND = "CleanupResources"  # the pseudo-kind roles grant cleanup with
KEY_KIND = "ServiceAccountKey"


@dataclass(frozen=True, slots=True, order=True)
class Finding:
    fqn: str
    kind: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"fqn": self.fqn, "kind": self.kind, "reason": self.reason}


@dataclass(slots=True)
class Findings:
    changes: list[Finding]
    skipped: list[Finding]

    def add(self, res: repo.Resource, reason: str, *, children: bool = False) -> None:
        if res.protected:
            self.skipped.append(
                Finding(res.fqn, res.kind, f"{reason}; skipped: deletionProtectionEnabled")
            )
        elif children:
            self.skipped.append(Finding(res.fqn, res.kind, f"{reason}; skipped: holds objects"))
        else:
            self.changes.append(Finding(res.fqn, res.kind, reason))


def _has_children(conn: Connection, res: repo.Resource, ignore: set[str]) -> bool:
    for kind in fqnmod.CHILDREN.get(res.kind, {}).values():
        if any(c.fqn not in ignore for c in repo.list_children(conn, res.fqn, kind, "", 2)):
            return True
    return False


def _orphan_keys(conn: Connection, organization: str) -> list[tuple[str, str]]:
    """(owner, key id) of keys under a cluster path whose cluster is gone.

    Keys are not resources, so this reads the key table over the organization's
    FQN range directly (the range the recursive delete uses).
    """
    lo, hi = fqnmod.subtree_bounds(organization)
    rows = conn.execute(
        sa.select(sa_keys.c.owner, sa_keys.c.id)
        .where(sa_keys.c.owner > lo, sa_keys.c.owner < hi)
        .order_by(sa_keys.c.owner, sa_keys.c.id)
    )
    out = []
    for owner, key_id in rows:
        parts = str(owner).split("/")
        under_cluster = len(parts) > 4 and parts[2] == "clusters"
        if under_cluster and not repo.exists(conn, "/".join(parts[:4])):
            out.append((str(owner), str(key_id)))
    return out


def find(conn: Connection, organization: str, names: OnboardingNames) -> Findings:
    found = Findings([], [])
    clusters = all_children(conn, organization, "Cluster")
    tenants = all_children(conn, organization, "Tenant")
    workspaces = [w for t in tenants for w in all_children(conn, t.fqn, "Workspace")]
    org = repo.get(conn, organization)
    levels = [r for r in (org, *tenants, *workspaces) if r is not None]

    # 1. the onboarding tenant and workspace, when nothing is onboarded
    configs = [config_of(conn, c.fqn) for c in clusters]
    onboarded = any(ob.onboarded(cfg.spec) for cfg in configs if cfg is not None)
    if not onboarded:
        ws = repo.get(conn, names.workspace_fqn(organization))
        reason = "onboarding {} with no onboarded namespace"
        if ws is not None:
            found.add(ws, reason.format("workspace"), children=_has_children(conn, ws, set()))
        tenant = repo.get(conn, names.tenant_fqn(organization))
        if tenant is not None:
            going = {f.fqn for f in found.changes}
            children = _has_children(conn, tenant, going)
            found.add(tenant, reason.format("tenant"), children=children)

    # 2. profiles attached nowhere
    attached = {ref for r in levels for ref in r.spec.get("profiles") or []}
    for level in levels:
        if level.kind in PROFILE_LEVELS:
            for profile in all_children(conn, level.fqn, "Profile"):
                if profile.fqn not in attached:
                    found.add(profile, "profile attached to no organization, tenant or workspace")

    # 3. security groups that select no reported namespace
    reported = [(c.name, ns["name"]) for c in clusters for ns in c.status.get("namespaces") or []]
    for ws in workspaces:
        for group in all_children(conn, ws.fqn, "SecurityGroup"):
            selector = group.spec.get("namespaceSelector") or ws.spec.get("namespaceSelector")
            patterns = (selector or {}).get("names") or []
            if not any(lookup.selects(patterns, c, n) for c, n in reported):
                found.add(
                    group,
                    f"namespace selector {patterns} matches no namespace the agents reported",
                )

    # 4. keys of deleted clusters
    for owner, key_id in _orphan_keys(conn, organization):
        found.changes.append(
            Finding(f"{owner}/keys/{key_id}", KEY_KIND, "key of a deleted cluster's account")
        )
    found.changes.sort()
    found.skipped.sort()
    return found


class CleanupService:
    def __init__(
        self,
        engine: Engine,
        names: OnboardingNames,
        on_commit: Callable[[int], None] | None = None,
    ) -> None:
        self.engine = engine
        self.names = names
        self.on_commit = on_commit

    def run(self, ctx: CallContext, organization: str, *, apply: bool) -> dict[str, Any]:
        if not apply:
            with read_tx(self.engine) as conn:
                found = self._find(conn, ctx, organization, rbac.READ)
            return _result(apply, found)
        with write_tx(self.engine) as conn:
            revision = repo.bump_revision(conn)
            found = self._find(conn, ctx, organization, rbac.DELETE)
            # Deepest first: a workspace before its tenant.
            for item in sorted(found.changes, key=lambda f: -f.fqn.count("/")):
                _delete(conn, item)
                audit(conn, ctx, item.fqn, item.kind, "CLEANUP", f"cleanup: {item.reason}")
            audit(
                conn,
                ctx,
                organization,
                "Organization",
                "CLEANUP_RESOURCES",
                f"cleanup deleted {len(found.changes)} objects, skipped {len(found.skipped)}",
                deleted=[f.fqn for f in found.changes],
                skipped=[f.fqn for f in found.skipped],
            )
        if self.on_commit is not None and found.changes:
            self.on_commit(revision)
        return _result(apply, found)

    def _find(
        self, conn: Connection, ctx: CallContext, organization: str, permission: str
    ) -> Findings:
        authz.require(conn, ctx.principal, organization, KIND, permission)
        if not repo.exists(conn, organization):
            raise not_found(organization)
        return find(conn, organization, self.names)


def _delete(conn: Connection, item: Finding) -> None:
    if item.kind == KEY_KIND:
        owner, _, key_id = item.fqn.rpartition("/keys/")
        repo.delete_key(conn, owner, key_id)
    else:
        repo.delete_subtree(conn, item.fqn)


def _result(apply: bool, found: Findings) -> dict[str, Any]:
    return {
        "apply": apply,
        "changes": [f.to_json() for f in found.changes],
        "skipped": [f.to_json() for f in found.skipped],
    }
