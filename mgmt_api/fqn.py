"""The one FQN parser: ``organizations/o/tenants/t/workspaces/w`` and friends.

An FQN alternates collection and name segments. Which collections may follow
which kind is a table (``CHILDREN``), derived from the one table of kinds
(:mod:`meshplane.kinds_contract`), so a new kind adds a row there rather
than a parser here.
The REST path of every object is ``/v2/`` + its FQN.

Two nodes have no name segment and exist only to carry policies: the root
(``""``, whose policy is the *root policy*) and ``rbac`` (the parent of every
Role; its policy is the *RBAC policy*).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from meshplane import kinds_contract
from meshplane.kinds_contract import Kind
from mgmt_api.errors import invalid

ROOT = ""
RBAC = "rbac"
ROOT_KIND = Kind.ROOT
RBAC_KIND = Kind.ROLE_COLLECTION

# parent kind -> {collection segment: child kind}, derived from the one kind table.
CHILDREN: dict[str, dict[str, Kind]] = {
    parent: dict(kids) for parent, kids in kinds_contract.children().items()
}

# Collections whose objects are Kubernetes-namespaced: the name segment is
# ``{namespace}.{name}``. Both halves are DNS-1123 labels, which cannot hold a
# dot, so the split is unambiguous and the FQN stays collection/name pairs.
NAMESPACED: frozenset[str] = kinds_contract.NAMESPACED_COLLECTIONS

#: A DNS-1123 label: every name segment of an FQN (and every other name the
#: API takes: namespaces, OIDC configuration names, dashboards). The one copy;
#: routes, models and validators all read it from here.
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
#: ``{namespace}.{name}``: the name segment of a namespaced kind.
NAMESPACED_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\.[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
MAX_NAME = 63
_DNS1123 = re.compile(NAME_PATTERN)

#: The service account a cluster's agent (and its ratelimit, extauthz and
#: gateway subscribers) authenticate as: ``{cluster}/serviceaccounts/agent``.
AGENT_SERVICE_ACCOUNT = "agent"


def is_name(value: str) -> bool:
    """Whether ``value`` is a DNS-1123 label of at most 63 characters."""
    return len(value) <= MAX_NAME and _DNS1123.match(value) is not None


def validate_name(value: str, field: str = "name") -> str:
    """Check a DNS-1123 label; the 400 names ``field``."""
    if not value:
        raise invalid(field, "is required")
    if len(value) > MAX_NAME:
        raise invalid(field, f"must be at most {MAX_NAME} characters")
    if not is_name(value):
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
    """A parsed FQN: the full string, its kind, name and parent FQN, and the
    name of every ancestor by its collection (``names["tenants"]``)."""

    value: str
    kind: Kind
    name: str
    parent: str
    names: tuple[tuple[str, str], ...] = ()

    def name_in(self, collection: str) -> str | None:
        """The name segment that follows ``collection`` in this FQN, if any."""
        for coll, name in self.names:
            if coll == collection:
                return name
        return None

    @property
    def organization(self) -> str | None:
        """The organization FQN this object lives in, if any."""
        org = self.name_in("organizations")
        return organization_fqn(org) if org is not None else None


def parse(value: str, field: str = "fqn") -> Fqn:
    """Parse and validate an FQN, naming ``field`` on failure."""
    if value == RBAC:
        raise invalid(field, "'rbac' is a collection, not an object")
    parts = value.split("/")
    if value.startswith("rbac/"):
        if len(parts) != 2:
            raise invalid(field, f"{value!r}: a role FQN is rbac/{{role}}")
        validate_name(parts[1], field)
        return Fqn(value, Kind.ROLE, parts[1], RBAC, (("rbac", parts[1]),))
    if len(parts) < 2 or len(parts) % 2:
        raise invalid(field, f"{value!r} is not an FQN (collection/name pairs expected)")
    kind: Kind = ROOT_KIND
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
    pairs = tuple(zip(parts[::2], parts[1::2], strict=True))
    return Fqn(value, kind, parts[-1], parent, pairs)


def node_kind(value: str) -> Kind:
    """The kind of a policy node: an object's, or the root's and ``rbac``'s pseudo-kinds."""
    if value == ROOT:
        return ROOT_KIND
    if value == RBAC:
        return RBAC_KIND
    return parse(value).kind


def child_fqn(parent: str, collection: str, name: str) -> str:
    if parent == RBAC:
        return f"rbac/{name}"
    return f"{parent}/{collection}/{name}" if parent else f"{collection}/{name}"


# ---- builders: the FQN of each kind from its path names ----------------------


def organization_fqn(organization: str) -> str:
    return f"organizations/{organization}"


def cluster_fqn(organization: str, cluster: str) -> str:
    return f"organizations/{organization}/clusters/{cluster}"


def tenant_fqn(organization: str, tenant: str) -> str:
    return f"organizations/{organization}/tenants/{tenant}"


def workspace_fqn(organization: str, tenant: str, workspace: str) -> str:
    return f"{tenant_fqn(organization, tenant)}/workspaces/{workspace}"


def security_group_fqn(organization: str, tenant: str, workspace: str, group: str) -> str:
    return f"{workspace_fqn(organization, tenant, workspace)}/securitygroups/{group}"


def agent_fqn(cluster: str) -> str:
    """The agent service account of the cluster whose FQN is ``cluster``."""
    return child_fqn(cluster, "serviceaccounts", AGENT_SERVICE_ACCOUNT)


def org_name(value: str) -> str:
    """The organization *name* an FQN belongs to (``""`` for global objects).

    Audit records are filed under it, so an organization's audit log shows
    every write below it. Works on any FQN-shaped string without validating it.
    """
    parts = value.split("/")
    return parts[1] if len(parts) >= 2 and parts[0] == "organizations" else ""


def cluster_of(value: str) -> str | None:
    """The FQN of the cluster ``value`` lies in (or is), without validating it."""
    parts = value.split("/")
    if len(parts) >= 4 and parts[0] == "organizations" and parts[2] == "clusters":
        return "/".join(parts[:4])
    return None


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
