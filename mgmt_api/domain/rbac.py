"""Permission resolution: policies on the path from the root + roles -> permissions.

A permission granted on a node holds on every node below it, so the effective
permissions of a principal on an FQN are the union, over the policies of the
FQN's ancestors (root first, the object itself last), of the rules of each
binding that names the principal or one of its teams. Role rules may be
limited to kinds; the kind checked is the target's (for CREATE: the kind being
created).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

READ = "READ"
WRITE = "WRITE"
CREATE = "CREATE"
DELETE = "DELETE"
SET_POLICY = "SET_POLICY"
ALL_PERMISSIONS: tuple[str, ...] = (READ, WRITE, CREATE, DELETE, SET_POLICY)

ADMIN_ROLE = "rbac/admin"


@dataclass(frozen=True, slots=True)
class Rule:
    """Permissions, optionally restricted to some kinds (``None`` = every kind)."""

    permissions: frozenset[str]
    kinds: frozenset[str] | None = None

    def applies_to(self, kind: str) -> bool:
        return self.kinds is None or kind in self.kinds


BUILTIN_ROLES: dict[str, tuple[Rule, ...]] = {
    ADMIN_ROLE: (Rule(frozenset(ALL_PERMISSIONS)),),
    "rbac/editor": (Rule(frozenset({READ, WRITE, CREATE})),),
    "rbac/creator": (Rule(frozenset({READ, CREATE})),),
    "rbac/writer": (Rule(frozenset({READ, WRITE})),),
    "rbac/reader": (Rule(frozenset({READ})),),
}

BUILTIN_DESCRIPTIONS: dict[str, str] = {
    ADMIN_ROLE: "Full access to the target and its children, including its policy.",
    "rbac/editor": "Read, write and create children.",
    "rbac/creator": "Read and create children.",
    "rbac/writer": "Read and write.",
    "rbac/reader": "Read only.",
}


def rules_from_spec(spec: Mapping[str, Any]) -> tuple[Rule, ...]:
    """Rules of a stored custom Role (``{"rules": [{"types", "permissions"}]}``)."""
    out: list[Rule] = []
    for raw in spec.get("rules") or []:
        kinds: set[str] | None = None
        types = raw.get("types") or []
        if types:
            kinds = set()
            for t in types:
                listed = t.get("kinds") or []
                if not listed:  # a type with no kinds means every kind
                    kinds = None
                    break
                kinds.update(listed)
        out.append(
            Rule(
                frozenset(raw.get("permissions") or []),
                frozenset(kinds) if kinds is not None else None,
            )
        )
    return tuple(out)


def binding_roles(allow: Sequence[Mapping[str, Any]], subjects: frozenset[str]) -> list[str]:
    """Roles bound to any of ``subjects`` (principal and team FQNs) in a policy."""
    roles: list[str] = []
    for binding in allow:
        for subject in binding.get("subjects") or []:
            if any(v in subjects for v in subject.values() if isinstance(v, str)):
                roles.append(str(binding.get("role", "")))
                break
    return roles


def referenced_roles(
    policies: Iterable[Sequence[Mapping[str, Any]]], subjects: frozenset[str]
) -> set[str]:
    return {r for allow in policies for r in binding_roles(allow, subjects)}


def effective_permissions(
    policies: Iterable[Sequence[Mapping[str, Any]]],
    subjects: frozenset[str],
    roles: Mapping[str, Sequence[Rule]],
    kind: str,
) -> frozenset[str]:
    """Union of the permissions the policies on the ancestor path grant ``subjects``.

    ``roles`` maps role FQN to its rules; unknown roles grant nothing (a
    deleted custom role silently stops granting instead of failing requests).
    """
    granted: set[str] = set()
    for allow in policies:
        for role in binding_roles(allow, subjects):
            for rule in roles.get(role, ()):
                if rule.applies_to(kind):
                    granted |= rule.permissions
    return frozenset(granted)


def sorted_permissions(perms: Iterable[str]) -> list[str]:
    order = {p: i for i, p in enumerate(ALL_PERMISSIONS)}
    return sorted(set(perms), key=lambda p: order.get(p, 99))


class StoredBinding(TypedDict):
    """One binding of a stored policy's ``allow``: a role and the subjects holding it,
    each ``{kind field: FQN}`` (``{"user": "organizations/o/users/a"}``)."""

    role: str
    subjects: list[dict[str, str]]


def admin_binding(subject_kind: str, subject_fqn: str) -> StoredBinding:
    """The binding a creator receives on what it creates."""
    return {"role": ADMIN_ROLE, "subjects": [{subject_kind: subject_fqn}]}


def subject_fqns(allow: Sequence[Mapping[str, Any]]) -> set[str]:
    """Every principal FQN a policy's bindings name."""
    return {
        v
        for binding in allow
        for subject in binding.get("subjects") or []
        for v in subject.values()
        if isinstance(v, str) and v
    }


def without_subjects(allow: Sequence[StoredBinding], gone: Collection[str]) -> list[StoredBinding]:
    """``allow`` minus every subject naming an FQN in ``gone``.

    A binding that named only such subjects goes too: it granted nobody
    who exists, and would grant the next object created under the name.
    """
    out: list[StoredBinding] = []
    for binding in allow:
        subjects = binding.get("subjects") or []
        kept = [s for s in subjects if not any(v in gone for v in s.values() if v)]
        if len(kept) == len(subjects):
            out.append(binding.copy())
        elif kept:
            out.append({**binding, "subjects": kept})
    return out


def keeps_an_admin(allow: Sequence[Mapping[str, Any]]) -> bool:
    """Whether some subject holds ``rbac/admin`` (the root policy must keep one)."""
    return any(b.get("role") == ADMIN_ROLE and b.get("subjects") for b in allow)
