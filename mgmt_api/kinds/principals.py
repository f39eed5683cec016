"""Deleting a principal forgets it everywhere: the one rule for users, teams and service accounts.

Bindings and team memberships name principals by FQN, and FQNs are reused:
a binding left behind by a deleted ``organizations/demo/users/alice`` would
give its role to the next user created under that name. So the write that
deletes principals (a User, Team or ServiceAccount; or an organization or
cluster holding some), whichever path it comes from (REST, the directory
sync), removes them in the same unit of work from:

- every access-policy binding (the root and RBAC policies, every object's
  policy), dropping a binding left with no subject;
- every team's ``members`` and nested ``status.memberTeams``;

and audits each object it changed. Policies and teams inside the deleted
subtree go with it and are not touched. The root policy must keep an
``rbac/admin`` subject, as a policy PUT must: deleting the last root admin
is refused.

:func:`unbind` and :func:`drop_members` are the two edits, shared with the
cleanup of subjects left dangling by releases before this rule.
"""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy.engine import Connection

from meshplane import kinds_contract
from meshplane.kinds_contract import Kind
from mgmt_api import fqn as fqnmod
from mgmt_api.domain import rbac
from mgmt_api.errors import ApiError, Code
from mgmt_api.store import repo
from mgmt_api.store.uow import Tx

_PRINCIPAL_KINDS = frozenset(kinds_contract.SUBJECT_KINDS.values())


def principals_in(conn: Connection, fqn: str, kind: str) -> set[str]:
    """The principals a delete of ``fqn`` (of ``kind``) removes: itself and those below it."""
    below = {n.fqn for n in repo.subtree_nodes(conn, fqn) if n.kind in _PRINCIPAL_KINDS}
    return below | {fqn} if kind in _PRINCIPAL_KINDS else below


def unbind(tx: Tx, policy: repo.Policy, gone: Collection[str], why: str) -> bool:
    """Remove the subjects in ``gone`` from ``policy``; audited. False when none was there."""
    allow = rbac.without_subjects(policy.allow, gone)
    if allow == policy.allow:
        return False
    holder = policy.fqn
    if holder == fqnmod.ROOT and not rbac.keeps_an_admin(allow):
        raise ApiError(
            Code.FAILED_PRECONDITION,
            f"{why} would leave the root policy without an rbac/admin subject; "
            "bind rbac/admin at the root to another principal first",
            metadata={"fqn": holder},
        )
    repo.update_policy_if_etag(
        tx.conn,
        holder,
        old_etag=policy.etag,
        allow=allow,
        description=policy.description,
        etag=tx.etag(holder, "#policy"),
    )
    removed = sorted(rbac.subject_fqns(policy.allow) - rbac.subject_fqns(allow))
    tx.audit(
        holder,
        fqnmod.node_kind(holder),
        "SET_POLICY",
        f"{why}: removed {', '.join(removed)} from the policy of {holder or 'root'}",
        allow=allow,
        removed=removed,
    )
    return True


def drop_members(tx: Tx, team: repo.Resource, gone: Collection[str], why: str) -> bool:
    """Remove the FQNs in ``gone`` from a team's members and nested teams; audited."""
    members = team.spec.get("members") or []
    nested = team.status.get("memberTeams") or []
    kept_members = [m for m in members if m not in gone]
    kept_nested = [t for t in nested if t not in gone]
    if len(kept_members) == len(members) and len(kept_nested) == len(nested):
        return False
    etag = tx.etag(team.fqn)
    if len(kept_members) != len(members):
        repo.update_if_etag(
            tx.conn,
            team.fqn,
            team.etag,
            spec={**team.spec, "members": kept_members},
            protected=team.protected,
            etag=etag,
            update_time=repo.now_us(),
        )
    if len(kept_nested) != len(nested):
        repo.set_status(tx.conn, team.fqn, {**team.status, "memberTeams": kept_nested}, etag)
    removed = sorted({*members, *nested} - {*kept_members, *kept_nested})
    tx.audit(
        team.fqn,
        Kind.TEAM,
        "UPDATE",
        f"{why}: removed {', '.join(removed)} from Team {team.fqn}",
        removed=removed,
    )
    return True


def forget(tx: Tx, fqn: str, kind: str) -> dict[str, list[str]]:
    """Before ``fqn`` is deleted: remove the principals it takes along from every
    binding and team outside it. Returns what changed, for the delete's audit record."""
    gone = principals_in(tx.conn, fqn, kind)
    if not gone:
        return {}
    # One pre-filter query each: the exact FQN, or anything below the deleted object.
    needle = f'"{fqn}"' if gone == {fqn} else f'"{fqn}/'
    why = f"deleting {kind} {fqn}"
    unbound = [
        p.fqn
        for p in repo.policies_mentioning(tx.conn, needle)
        if not _inside(p.fqn, fqn) and unbind(tx, p, gone, why)
    ]
    teams = [
        t.fqn
        for t in repo.mentioning(tx.conn, Kind.TEAM, needle)
        if not _inside(t.fqn, fqn) and drop_members(tx, t, gone, why)
    ]
    return {"unboundFrom": unbound, "removedFromTeams": teams}


def _inside(value: str, fqn: str) -> bool:
    return value == fqn or value.startswith(fqn + "/")
