"""Per-kind validation of specs beyond what the pydantic models express.

Each check raises INVALID_ARGUMENT naming the field as the client wrote it
(``cluster.tokenTtl``, ``workspace.namespaceSelector.names[2]``).
"""

from __future__ import annotations

import re
from typing import Any

from mgmt_api import fqn as fqnmod
from mgmt_api.auth import passwords
from mgmt_api.domain import rbac
from mgmt_api.domain.durations import format_duration, parse_duration
from mgmt_api.errors import invalid

SELECTOR_PATTERN = re.compile(r"^(\*|[^/*]+)/(\*|[^/*]+\*?)$")
DEFAULT_TOKEN_TTL = "3600s"  # noqa: S105 - a duration


def _selector(spec: dict[str, Any], prefix: str, required: bool) -> None:
    sel = spec.get("namespaceSelector")
    if sel is None:
        if required:
            raise invalid(f"{prefix}.namespaceSelector", "is required")
        return
    names = sel.get("names") or []
    if not names:
        raise invalid(f"{prefix}.namespaceSelector.names", "needs at least one cluster/namespace")
    for i, name in enumerate(names):
        if not SELECTOR_PATTERN.match(name):
            raise invalid(
                f"{prefix}.namespaceSelector.names[{i}]",
                f"{name!r} is not cluster/namespace "
                "('*' for a segment, trailing '*' on the namespace)",
            )


def validate(kind: str, prefix: str, spec: dict[str, Any], creating: bool) -> dict[str, Any]:
    """Validate and normalise ``spec`` (camelCase) of ``kind``; returns the spec to store."""
    if kind == "Workspace":
        _selector(spec, prefix, required=True)
    elif kind == "SecurityGroup":
        _selector(spec, prefix, required=False)
    elif kind == "Organization":
        for i, ns in enumerate(spec.get("systemNamespaces") or []):
            fqnmod.validate_name(ns, f"{prefix}.systemNamespaces[{i}]")
    elif kind == "Cluster":
        ttl = spec.get("tokenTtl")
        seconds = parse_duration(ttl, f"{prefix}.tokenTtl") if ttl is not None else 3600.0
        spec["tokenTtl"] = format_duration(seconds)
        spec.setdefault("tier1Cluster", False)
    elif kind == "Team":
        for i, member in enumerate(spec.get("members") or []):
            field = f"{prefix}.members[{i}]"
            parsed = fqnmod.parse(member, field)
            if parsed.kind not in ("User", "ServiceAccount"):
                raise invalid(field, "members are user or service-account FQNs")
        spec.setdefault("sourceType", "MANUAL")
    elif kind == "User":
        spec.setdefault("sourceType", "MANUAL")
    elif kind == "Role" and creating and not spec.get("rules"):
        raise invalid(f"{prefix}.rules", "a role needs at least one rule")
    return spec


def validate_password(password: str, field: str) -> None:
    if not passwords.MIN_LENGTH <= len(password) <= passwords.MAX_LENGTH:
        raise invalid(field, f"must be {passwords.MIN_LENGTH} to {passwords.MAX_LENGTH} characters")


def validate_policy(allow: list[dict[str, Any]], known_custom_roles: set[str]) -> None:
    """Bindings name an existing role and subjects of the right kind."""
    kinds = {"user": "User", "team": "Team", "serviceAccount": "ServiceAccount"}
    for i, binding in enumerate(allow):
        role = binding.get("role", "")
        if role not in rbac.BUILTIN_ROLES and role not in known_custom_roles:
            raise invalid(
                f"allow[{i}].role", f"{role!r} is not a role (rbac/admin, rbac/editor, ...)"
            )
        for j, subject in enumerate(binding.get("subjects") or []):
            set_fields = [k for k, v in subject.items() if v]
            field = f"allow[{i}].subjects[{j}]"
            if len(set_fields) != 1:
                raise invalid(field, "exactly one of user, team, serviceAccount is required")
            key = set_fields[0]
            parsed = fqnmod.parse(subject[key], f"{field}.{key}")
            if parsed.kind != kinds[key]:
                raise invalid(f"{field}.{key}", f"{subject[key]!r} is not a {kinds[key]} FQN")
