"""The one FQN parser: ``organizations/o/tenants/t/workspaces/w`` and friends.

An FQN alternates collection and name segments. Which collections may follow
which kind is a table (``CHILDREN``), so later issues add kinds by adding rows
(for example ``backendtrafficpolicies`` under a cluster) rather than parsers.
The REST path of every object is ``/v2/`` + its FQN.

Two nodes have no name segment and exist only to carry policies: the root
(``""``, whose policy is the *root policy*) and ``rbac`` (the parent of every
Role; its policy is the *RBAC policy*).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mgmt_api.errors import invalid

ROOT = ""
RBAC = "rbac"
ROOT_KIND = "Root"
RBAC_KIND = "RoleCollection"

# parent kind -> {collection segment: child kind}
CHILDREN: dict[str, dict[str, str]] = {
    ROOT_KIND: {"organizations": "Organization", "users": "User"},
    RBAC_KIND: {},
    "Organization": {
        "tenants": "Tenant",
        "clusters": "Cluster",
        "users": "User",
        "teams": "Team",
        "serviceaccounts": "ServiceAccount",
        "profiles": "Profile",
        "approvals": "ApprovalPolicy",
    },
    "Tenant": {"workspaces": "Workspace", "profiles": "Profile"},
    "Workspace": {"securitygroups": "SecurityGroup", "profiles": "Profile"},
    "SecurityGroup": {"settings": "SecuritySetting", "extauthzpolicies": "ExtAuthzPolicy"},
    "Cluster": {
        "serviceaccounts": "ServiceAccount",
        "backendtrafficpolicies": "BackendTrafficPolicy",
        "approvals": "ApprovalPolicy",
        "onboarding": "ClusterOnboardingConfig",
    },
}

# Collections whose objects are Kubernetes-namespaced: the name segment is
# ``{namespace}.{name}``. Both halves are DNS-1123 labels, which cannot hold a
# dot, so the split is unambiguous and the FQN stays collection/name pairs.
NAMESPACED: frozenset[str] = frozenset({"backendtrafficpolicies"})

_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME = 63


def validate_name(value: str, field: str = "name") -> str:
    """Check a DNS-1123 label; the 400 names ``field``."""
    if not value:
        raise invalid(field, "is required")
    if len(value) > MAX_NAME:
        raise invalid(field, f"must be at most {MAX_NAME} characters")
    if not _DNS1123.match(value):
        raise invalid(
            field,
            f"{value!r} is not a DNS-1123 label (lower-case letters, digits and '-', "
            "starting and ending with a letter or digit)",
        )
    return value


def validate_segment(collection: str, value: str, field: str = "name") -> str:
    """Check the name segment of an object in ``collection`` (``ns.name`` when namespaced)."""
    if collection not in NAMESPACED:
        return validate_name(value, field)
    namespace, sep, name = value.partition(".")
    if len(value) > MAX_NAME:  # the store's name column holds the whole segment
        raise invalid(field, f"{{namespace}}.{{name}} must be at most {MAX_NAME} characters")
    if not sep:
        raise invalid(field, f"{value!r}: a namespaced object is named {{namespace}}.{{name}}")
    validate_name(namespace, field)
    validate_name(name, field)
    return value


def split_namespaced(value: str) -> tuple[str, str]:
    """``"ns.name"`` → ``("ns", "name")`` for an already validated segment."""
    namespace, _, name = value.partition(".")
    return namespace, name


@dataclass(frozen=True, slots=True)
class Fqn:
    """A parsed FQN: the full string, its kind, name and parent FQN."""

    value: str
    kind: str
    name: str
    parent: str

    @property
    def organization(self) -> str | None:
        """The organization FQN this object lives in, if any."""
        parts = self.value.split("/")
        if len(parts) >= 2 and parts[0] == "organizations":
            return f"organizations/{parts[1]}"
        return None


def parse(value: str, field: str = "fqn") -> Fqn:
    """Parse and validate an FQN, naming ``field`` on failure."""
    if value == RBAC:
        raise invalid(field, "'rbac' is a collection, not an object")
    parts = value.split("/")
    if value.startswith("rbac/"):
        if len(parts) != 2:
            raise invalid(field, f"{value!r}: a role FQN is rbac/{{role}}")
        validate_name(parts[1], field)
        return Fqn(value, "Role", parts[1], RBAC)
    if len(parts) < 2 or len(parts) % 2:
        raise invalid(field, f"{value!r} is not an FQN (collection/name pairs expected)")
    kind = ROOT_KIND
    parent = ROOT
    for i in range(0, len(parts), 2):
        collection, name = parts[i], parts[i + 1]
        child = CHILDREN.get(kind, {}).get(collection)
        if child is None:
            raise invalid(field, f"{value!r}: no collection {collection!r} under {kind}")
        validate_segment(collection, name, field)
        if i:
            parent = "/".join(parts[:i])
        kind = child
    return Fqn(value, kind, parts[-1], parent)


def child_fqn(parent: str, collection: str, name: str) -> str:
    if parent == RBAC:
        return f"rbac/{name}"
    return f"{parent}/{collection}/{name}" if parent else f"{collection}/{name}"


def ancestors(value: str) -> list[str]:
    """Policy nodes from the root down to ``value`` itself, inclusive.

    ``organizations/o/clusters/c`` gives ``["", "organizations/o",
    "organizations/o/clusters/c"]``; a role gives ``["", "rbac", "rbac/r"]``.
    """
    if not value:
        return [ROOT]
    if value == RBAC:
        return [ROOT, RBAC]
    if value.startswith("rbac/"):
        return [ROOT, RBAC, value]
    parts = value.split("/")
    return [ROOT] + ["/".join(parts[: i + 2]) for i in range(0, len(parts), 2)]


def subtree_bounds(value: str) -> tuple[str, str]:
    """Exclusive bounds ``(lo, hi)`` of the FQNs strictly below ``value``.

    Descendants are exactly the strings starting with ``value + "/"``; since
    ``"0"`` is the character after ``"/"``, they sort strictly between
    ``value + "/"`` and ``value + "0"`` under byte order (PostgreSQL columns use
    ``COLLATE "C"``), so a range scan of the primary key finds them.
    """
    return value + "/", value + "0"
