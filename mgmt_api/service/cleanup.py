"""``POST /v2/organizations/{org}/cleanupresources``: find and delete unused objects.

Unused, within one organization:

1. the onboarding tenant and workspace when no onboarding config of any of
   the organization's clusters onboards a namespace (and they hold nothing
   else);
2. profiles attached to no organization, tenant or workspace;
3. security groups whose namespace selector (their own, else their
   workspace's) matches no namespace any of the organization's agents
   reported, and names no cluster whose agent never reported or went stale
   (such a cluster's namespaces are unknown, so the group may well be used);
4. service-account keys whose owner lives under a cluster that no longer
   exists (deleting a cluster revokes its keys in the same transaction, so
   these are leftovers of imports, restores or older releases);
5. dangling subjects: deleted users, teams and service accounts still named
   in an access-policy binding (of the organization or anything in it; and
   the organization's own principals in the root and RBAC policies) or in
   one of its teams' members. Deleting a principal removes it from both
   (:mod:`mgmt_api.kinds.principals`); these are leftovers of releases
   before that rule, and would give their grants to the next principal
   created under the same name. Applying removes the subject, not the
   policy or team; the root policy's last ``rbac/admin`` subject is
   reported and skipped.

Candidates are found and, with ``apply``, deleted in one transaction, so the
applied set is exactly what a dry run on the same state lists. A candidate is
skipped and reported, never deleted, when anything in its subtree has
``deletionProtectionEnabled`` or when it holds other objects (a security
group's settings and ext_authz policies, another engineer's objects in the
onboarding workspace): the recursive delete would take those along silently.
The operation has its own permission: READ (dry run) or DELETE (apply) for
kind ``CleanupResources`` on the organization, so a role can grant cleanup
without granting deletes of every kind.

The organization's tree is read once (FQN, parent, kind and protection of
every object, no JSON), then the specs of the few kinds that matter and the
reported namespaces of its clusters in batches: the cost does not grow with
one query per object.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from meshplane.kinds_contract import Kind
from mgmt_api import access as authz
from mgmt_api import fqn as fqnmod
from mgmt_api.access import CallContext
from mgmt_api.domain import inventory as inv
from mgmt_api.domain import lookup, rbac
from mgmt_api.domain import onboarding as ob
from mgmt_api.errors import ApiError, not_found
from mgmt_api.fqn import subtree_bounds
from mgmt_api.kinds import KindSettings, principals
from mgmt_api.schemas.cleanup import CleanupItem, CleanupResourcesResponse
from mgmt_api.store import repo
from mgmt_api.store.tables import sa_keys
from mgmt_api.store.uow import Tx, UnitOfWork

KIND = "CleanupResources"  # the pseudo-kind roles grant cleanup with
KEY_KIND = "ServiceAccountKey"
_BATCH = 200  # objects per IN (...) read


@dataclass(frozen=True, slots=True, order=True)
class Finding:
    fqn: str
    kind: str
    reason: str
    #: For a dangling subject: the policy holder (or team, with ``team``) naming it.
    holder: str | None = None
    team: bool = False

    def item(self) -> CleanupItem:
        return CleanupItem(fqn=self.fqn, kind=self.kind, reason=self.reason)


class Tree:
    """The organization's objects as FQN, parent, kind and protection, read once."""

    def __init__(self, organization: str, nodes: Sequence[repo.Node]) -> None:
        self.organization = organization
        self.children: dict[str, list[repo.Node]] = defaultdict(list)
        for node in nodes:
            self.children[node.parent].append(node)
        self.protected = sorted(n.fqn for n in nodes if n.protected)
        self._protected = set(self.protected)

    def of_kind(self, parent: str, kind: str) -> list[repo.Node]:
        return [n for n in self.children.get(parent, []) if n.kind == kind]

    def first_protected(self, fqn: str) -> str | None:
        """The first protected object in ``fqn``'s subtree, itself included.

        The predicate of :func:`mgmt_api.store.repo.first_protected` (the one
        the recursive delete refuses on), over the tree already read.
        """
        if fqn in self._protected:
            return fqn
        lo, hi = subtree_bounds(fqn)
        i = bisect.bisect_right(self.protected, lo)
        return self.protected[i] if i < len(self.protected) and self.protected[i] < hi else None

    def held(self, fqn: str, ignore: Iterable[str] = ()) -> list[repo.Node]:
        """The objects directly under ``fqn``, except those in ``ignore``."""
        skip = set(ignore)
        return [n for n in self.children.get(fqn, []) if n.fqn not in skip]


@dataclass(slots=True)
class Findings:
    tree: Tree
    changes: list[Finding]
    skipped: list[Finding]

    def add(self, node: repo.Node, reason: str, *, ignore: Iterable[str] = ()) -> None:
        """A candidate: a change, or skipped when its subtree is protected or it holds objects."""
        protected = self.tree.first_protected(node.fqn)
        held = self.tree.held(node.fqn, ignore)
        if protected is not None:
            who = "it has" if protected == node.fqn else f"{protected} has"
            why = f"{who} deletionProtectionEnabled"
        elif held:
            kinds = ", ".join(sorted({n.kind for n in held}))
            why = f"holds objects ({len(held)}: {kinds})"
        else:
            self.changes.append(Finding(node.fqn, node.kind, reason))
            return
        self.skipped.append(Finding(node.fqn, node.kind, f"{reason}; skipped: {why}"))


def _specs(conn: Connection, fqns: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for i in range(0, len(fqns), _BATCH):
        out.update({f: r.spec for f, r in repo.get_many(conn, fqns[i : i + _BATCH]).items()})
    return out


def _reports(
    conn: Connection, clusters: list[repo.Node], now_us: int, stale_after_seconds: float
) -> tuple[list[tuple[str, str]], set[str]]:
    """(cluster, namespace) pairs the fresh reports list, and the clusters with none.

    A cluster whose agent never reported, or has been silent longer than the
    staleness threshold, is "unknown": its namespaces cannot be trusted.
    """
    reported: list[tuple[str, str]] = []
    unknown: set[str] = set()
    for i in range(0, len(clusters), _BATCH):
        batch = clusters[i : i + _BATCH]
        statuses = repo.statuses_of(conn, [c.fqn for c in batch])
        for cluster in batch:
            name = cluster.fqn.rsplit("/", 1)[1]
            status = statuses.get(cluster.fqn, {})
            sync = status.get("syncTimeUs")
            if sync is None or inv.is_stale(int(sync), now_us, stale_after_seconds):
                unknown.add(name)
                continue
            reported += [(name, ns["name"]) for ns in status.get("namespaces") or []]
    return reported, unknown


def _unknown_clusters(patterns: list[str], unknown: set[str]) -> list[str]:
    """The clusters without a fresh report that ``patterns`` name (``*`` names all)."""
    named = {p.partition("/")[0] for p in patterns}
    return sorted(unknown if "*" in named else unknown & named)


def _orphan_keys(conn: Connection, tree: Tree) -> list[tuple[str, str]]:
    """(owner, key id) of keys under a cluster path whose cluster is gone.

    Keys are not resources, so this reads the key table over the organization's
    FQN range directly (the range the recursive delete uses).
    """
    clusters = {n.fqn for n in tree.of_kind(tree.organization, Kind.CLUSTER)}
    lo, hi = subtree_bounds(tree.organization)
    rows = conn.execute(
        sa.select(sa_keys.c.owner, sa_keys.c.id)
        .where(sa_keys.c.owner > lo, sa_keys.c.owner < hi)
        .order_by(sa_keys.c.owner, sa_keys.c.id)
    )
    out = []
    for owner, key_id in rows:
        cluster = fqnmod.cluster_of(str(owner))
        if cluster is not None and str(owner) != cluster and cluster not in clusters:
            out.append((str(owner), str(key_id)))
    return out


def find(
    conn: Connection,
    organization: str,
    names: KindSettings,
    *,
    stale_after_seconds: float,
    now_us: int,
) -> Findings:
    tree = Tree(organization, repo.subtree_nodes(conn, organization))
    found = Findings(tree, [], [])
    clusters = tree.of_kind(organization, Kind.CLUSTER)
    tenants = tree.of_kind(organization, Kind.TENANT)
    workspaces = [w for t in tenants for w in tree.of_kind(t.fqn, Kind.WORKSPACE)]
    groups = [g for w in workspaces for g in tree.of_kind(w.fqn, Kind.SECURITY_GROUP)]
    configs = [c for cl in clusters for c in tree.of_kind(cl.fqn, Kind.CLUSTER_ONBOARDING_CONFIG)]
    levels = [organization, *(t.fqn for t in tenants), *(w.fqn for w in workspaces)]
    specs = _specs(conn, [*levels, *(g.fqn for g in groups), *(c.fqn for c in configs)])

    # 1. profiles attached nowhere
    attached = {ref for lv in levels for ref in specs.get(lv, {}).get("profiles") or []}
    for level in levels:
        for profile in tree.of_kind(level, Kind.PROFILE):
            if profile.fqn not in attached:
                found.add(profile, "profile attached to no organization, tenant or workspace")

    # 2. security groups that select no reported namespace
    reported, unknown = _reports(conn, clusters, now_us, stale_after_seconds)
    for group in groups:
        selector = specs.get(group.fqn, {}).get("namespaceSelector") or specs.get(
            group.parent, {}
        ).get("namespaceSelector")
        patterns = list((selector or {}).get("names") or [])
        if any(lookup.selects(patterns, c, n) for c, n in reported):
            continue
        reason = f"namespace selector {patterns} matches no namespace the agents reported"
        maybe = _unknown_clusters(patterns, unknown)
        if maybe:
            found.skipped.append(
                Finding(
                    group.fqn,
                    group.kind,
                    f"{reason}; skipped: it names clusters whose agents never reported or "
                    f"are stale, so their namespaces are unknown ({', '.join(maybe)})",
                )
            )
            continue
        found.add(group, reason)

    # 3. the onboarding tenant and workspace, when nothing is onboarded
    onboarded = any(ob.onboarded(specs.get(c.fqn, {})) for c in configs)
    if not onboarded:
        reason = "onboarding {} with no onboarded namespace"
        ws_fqn = names.onboarding_workspace_fqn(organization)
        tenant_fqn = names.onboarding_tenant_fqn(organization)
        tenant = next((t for t in tenants if t.fqn == tenant_fqn), None)
        ws = next((w for w in workspaces if w.fqn == ws_fqn), None)
        if ws is not None:
            found.add(ws, reason.format("workspace"))
        if tenant is not None:
            # Its onboarding workspace goes first (deepest first), so it does
            # not count; anything else it holds does.
            going = [ws_fqn] if any(f.fqn == ws_fqn for f in found.changes) else []
            found.add(tenant, reason.format("tenant"), ignore=going)

    # 4. keys of deleted clusters
    for owner, key_id in _orphan_keys(conn, tree):
        found.changes.append(
            Finding(f"{owner}/keys/{key_id}", KEY_KIND, "key of a deleted cluster's account")
        )
    # 5. deleted principals still named in bindings and teams
    _dangling_subjects(conn, tree, found)
    found.changes.sort()
    found.skipped.sort()
    return found


def _dangling_subjects(conn: Connection, tree: Tree, found: Findings) -> None:
    """Subjects of the organization's policies and teams that no longer exist (see 5.)."""
    org = tree.organization
    named: list[tuple[str, str, bool]] = []  # (subject, holder, in a team)
    for policy in repo.policies_in_subtree(conn, org):
        named += [(s, policy.fqn, False) for s in sorted(rbac.subject_fqns(policy.allow))]
    global_policies = repo.get_policies(conn, [fqnmod.ROOT, fqnmod.RBAC])
    for policy in global_policies.values():
        subjects = sorted(rbac.subject_fqns(policy.allow))
        named += [(s, policy.fqn, False) for s in subjects if s.startswith(org + "/")]
    teams = [t.fqn for t in tree.of_kind(org, Kind.TEAM)]
    for i in range(0, len(teams), _BATCH):
        for team in repo.get_many(conn, teams[i : i + _BATCH]).values():
            members = [*(team.spec.get("members") or []), *(team.status.get("memberTeams") or [])]
            named += [(m, team.fqn, True) for m in members]
    subjects = sorted({s for s, _, _ in named})
    existing: set[str] = set()
    for i in range(0, len(subjects), _BATCH):
        existing |= set(repo.get_many(conn, subjects[i : i + _BATCH]))
    gone = {s for s in subjects if s not in existing}
    root = global_policies.get(fqnmod.ROOT)
    root_stuck = root is not None and not rbac.keeps_an_admin(
        rbac.without_subjects(root.allow, gone)
    )
    for subject, holder, in_team in named:
        if subject not in gone:
            continue
        kind = _kind_of(subject)
        where = f"team {holder}" if in_team else f"the access policy of {holder or 'root'}"
        finding = Finding(subject, kind, f"deleted {kind} still named in {where}", holder, in_team)
        if holder == fqnmod.ROOT and root_stuck:
            reason = f"{finding.reason}; skipped: the root policy must keep an rbac/admin subject"
            found.skipped.append(Finding(subject, kind, reason, holder, in_team))
        else:
            found.changes.append(finding)


class CleanupService:
    def __init__(self, uow: UnitOfWork, settings: KindSettings) -> None:
        self.uow = uow
        self.settings = settings

    def run(self, ctx: CallContext, organization: str, *, apply: bool) -> CleanupResourcesResponse:
        if not apply:
            with self.uow.read() as conn:
                found = self._find(conn, ctx, organization, rbac.READ)
            return _result(apply, found)
        with self.uow.write(ctx.principal.fqn) as tx:
            found = self._find(tx.conn, ctx, organization, rbac.DELETE)
            # Deepest first: a workspace before its tenant.
            for item in sorted(found.changes, key=lambda f: -f.fqn.count("/")):
                _delete(tx, item)
                tx.audit(item.fqn, item.kind, "CLEANUP", f"cleanup: {item.reason}")
            tx.audit(
                organization,
                Kind.ORGANIZATION,
                "CLEANUP_RESOURCES",
                f"cleanup deleted {len(found.changes)} objects, skipped {len(found.skipped)}",
                deleted=[f.fqn for f in found.changes],
                skipped=[f.fqn for f in found.skipped],
            )
        return _result(apply, found)

    def _find(
        self, conn: Connection, ctx: CallContext, organization: str, permission: str
    ) -> Findings:
        authz.require(conn, ctx.principal, organization, KIND, permission)
        if not repo.exists(conn, organization):
            raise not_found(organization)
        return find(
            conn,
            organization,
            self.settings,
            stale_after_seconds=self.settings.stale_after_seconds,
            now_us=repo.now_us(),
        )


def _delete(tx: Tx, item: Finding) -> None:
    conn = tx.conn
    if item.holder is not None:
        _forget(tx, item)
    elif item.kind == KEY_KIND:
        owner, _, key_id = item.fqn.rpartition("/keys/")
        repo.delete_key(conn, owner, key_id)
    else:
        repo.delete_subtree(conn, item.fqn)


def _kind_of(subject: str) -> str:
    try:
        return fqnmod.parse(subject).kind
    except ApiError:  # not an FQN at all: stored before subjects were validated
        return "Unknown"


def _forget(tx: Tx, item: Finding) -> None:
    """Remove a dangling subject from the policy or team that names it."""
    assert item.holder is not None
    why = "cleanup of a deleted principal"
    if item.team:
        team = repo.get(tx.conn, item.holder)
        if team is not None:
            principals.drop_members(tx, team, {item.fqn}, why)
        return
    policy = repo.get_policies(tx.conn, [item.holder]).get(item.holder)
    if policy is not None:
        principals.unbind(tx, policy, {item.fqn}, why)


def _result(apply: bool, found: Findings) -> CleanupResourcesResponse:
    return CleanupResourcesResponse(
        apply=apply,
        changes=[f.item() for f in found.changes],
        skipped=[f.item() for f in found.skipped],
    )
