"""Who is calling, and what it may do: the policies stored on the FQN tree.

An object's effective permissions for a principal are the union of what the
policies on its path (root, then each ancestor, then itself) grant the
principal or its teams, through built-in or custom roles
(:mod:`mgmt_api.domain.rbac`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.engine import Connection

from mgmt_api import fqn as fqnmod
from mgmt_api.domain import rbac
from mgmt_api.errors import permission_denied
from mgmt_api.fqn import ancestors
from mgmt_api.store import repo


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: its FQN, the binding subject field, and all FQNs it acts as."""

    fqn: str
    subject_field: str  # "user" or "serviceAccount", for creator bindings
    subjects: frozenset[str]


@dataclass(frozen=True, slots=True)
class CallContext:
    """An authenticated call: who, and the management plane's address as the caller sees it."""

    principal: Principal
    base_url: str  # what agents should use (install templates)


def node_kind(fqn: str) -> str:
    """The kind a policy node's permissions are checked for (root and RBAC included)."""
    if fqn == fqnmod.ROOT:
        return fqnmod.ROOT_KIND
    if fqn == fqnmod.RBAC:
        return fqnmod.RBAC_KIND
    return fqnmod.parse(fqn).kind


def _role_rules(conn: Connection, names: set[str]) -> dict[str, tuple[rbac.Rule, ...]]:
    rules: dict[str, tuple[rbac.Rule, ...]] = {
        n: rbac.BUILTIN_ROLES[n] for n in names if n in rbac.BUILTIN_ROLES
    }
    custom = [n for n in names if n not in rbac.BUILTIN_ROLES and n.startswith("rbac/")]
    for fqn, res in repo.get_many(conn, custom).items():
        rules[fqn] = rbac.rules_from_spec(res.spec)
    return rules


def permissions(conn: Connection, principal: Principal, fqn: str, kind: str) -> frozenset[str]:
    nodes = ancestors(fqn)
    stored = repo.get_policies(conn, nodes)
    allows = [stored[n].allow for n in nodes if n in stored]
    roles = _role_rules(conn, rbac.referenced_roles(allows, principal.subjects))
    return rbac.effective_permissions(allows, principal.subjects, roles, kind)


def require(conn: Connection, principal: Principal, fqn: str, kind: str, permission: str) -> None:
    if permission not in permissions(conn, principal, fqn, kind):
        raise permission_denied(permission, fqn, kind)


def readable(
    conn: Connection, principal: Principal, parent: str, fqns: Sequence[str], kind: str
) -> set[str]:
    """The subset of sibling ``fqns`` (children of ``parent``) the principal may READ.

    One policy query for the ancestor path plus the children themselves, so a
    page of results costs the same as one permission check.
    """
    nodes = ancestors(parent) if parent else [""]
    stored = repo.get_policies(conn, [*nodes, *fqns])
    above = [stored[n].allow for n in nodes if n in stored]
    all_allows = above + [stored[f].allow for f in fqns if f in stored]
    roles = _role_rules(conn, rbac.referenced_roles(all_allows, principal.subjects))
    if rbac.READ in rbac.effective_permissions(above, principal.subjects, roles, kind):
        return set(fqns)
    out: set[str] = set()
    for f in fqns:
        own = [stored[f].allow] if f in stored else []
        if rbac.READ in rbac.effective_permissions(own, principal.subjects, roles, kind):
            out.add(f)
    return out
