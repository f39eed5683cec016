"""The resource kinds meshctl knows, and the mapping between names, FQNs and REST paths.

This is the client's copy of the API's public contract (``docs/api.md``,
"FQNs and paths"), not an import of the server's registry: meshctl talks to
the REST API only, so it can be shipped and versioned apart from the
server. An FQN alternates collection and name; the REST path of an object is
``/v2/`` + its FQN; creating posts ``{"name", "<bodyField>": {...}}`` to the
collection, and listing answers ``{"<listField>": [...], "nextPageToken"}``.

A kind can live under several parents (a User is global or in an
organization; a ServiceAccount is in an organization or a cluster). Each
alternative is a chain of parent kinds, outermost first; the chain used is the
longest one whose parent names are all known.

Being a copy, it can drift: ``tests/meshctl/test_kinds_match_server.py``
compares it with the server's registry (``mgmt_api.kinds.KINDS``), so a new
server kind fails the suite until it has a row here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from meshctl.errors import Exit, MeshctlError

POLICY_KIND = "AccessPolicy"


@dataclass(frozen=True, slots=True)
class Kind:
    name: str  # "Cluster"
    collection: str  # "clusters"
    body_field: str  # create body wrapper: "cluster"
    list_field: str  # list response field: "clusters"
    chains: tuple[tuple[str, ...], ...]  # alternative parent chains (kind names)
    aliases: tuple[str, ...] = ()
    # Fields the server owns: shown under ``status`` and never sent back.
    status_fields: frozenset[str] = field(default_factory=frozenset)
    # Values the server fills in when a field is omitted (docs/api.md), so that
    # apply can tell "unchanged" from "would reset to the default".
    defaults: tuple[tuple[str, object], ...] = ()

    @property
    def metadata_key(self) -> str:
        """The key naming an object of this kind as a parent, e.g. ``organization``."""
        return self.name[0].lower() + self.name[1:]

    @property
    def flag(self) -> str:
        """The CLI option naming a parent of this kind: ``--org``, ``--security-group``."""
        if self.name == "Organization":
            return "--org"
        return "--" + re.sub(r"(?<!^)([A-Z])", r"-\1", self.name).lower()


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind("Organization", "organizations", "organization", "organizations", ((),),
             ("org", "orgs")),
        Kind("Tenant", "tenants", "tenant", "tenants", (("Organization",),), ("tn",)),
        Kind("Workspace", "workspaces", "workspace", "workspaces",
             (("Organization", "Tenant"),), ("ws",)),
        Kind("SecurityGroup", "securitygroups", "securityGroup", "securityGroups",
             (("Organization", "Tenant", "Workspace"),), ("sg",)),
        Kind("Cluster", "clusters", "cluster", "clusters", (("Organization",),), ("cl",),
             frozenset({"namespaces", "state", "installTemplate", "serviceAccount"}),
             defaults=(("tokenTtl", "3600s"), ("tier1Cluster", False))),
        Kind("Profile", "profiles", "profile", "profiles",
             (("Organization",), ("Organization", "Tenant"),
              ("Organization", "Tenant", "Workspace")), ("prof",)),
        Kind("ClusterOnboardingConfig", "onboarding", "config", "configs",
             (("Organization", "Cluster"),), ("onboardingconfig", "onboardingconfigs")),
        Kind("User", "users", "user", "users", (("Organization",), ()), (),
             frozenset({"sourceType"})),
        Kind("Team", "teams", "team", "teams", (("Organization",),), (),
             frozenset({"sourceType"})),
        Kind("ServiceAccount", "serviceaccounts", "serviceAccount", "serviceAccounts",
             (("Organization", "Cluster"), ("Organization",)), ("sa",), frozenset({"keys"})),
        Kind("BackendTrafficPolicy", "backendtrafficpolicies", "backendTrafficPolicy",
             "backendTrafficPolicies", (("Organization", "Cluster"),), ("btp",)),
        Kind("HTTPRoute", "httproutes", "httpRoute", "httpRoutes",
             (("Organization", "Cluster"),), ("route", "routes")),
        Kind("Backend", "backends", "backend", "backends", (("Organization", "Cluster"),)),
        Kind("SecuritySetting", "settings", "securitySetting", "settings",
             (("Organization", "Tenant", "Workspace", "SecurityGroup"),),
             ("securitysettings", "setting")),
        Kind("ExtAuthzPolicy", "extauthzpolicies", "extAuthzPolicy", "extAuthzPolicies",
             (("Organization", "Tenant", "Workspace", "SecurityGroup"),), ("eap",)),
        Kind("Role", "rbac", "role", "roles", ((),), ("roles",)),
    )
}  # fmt: skip

# Fields every object carries that are bookkeeping, not desired state.
METADATA_FIELDS = ("fqn", "etag", "createTime", "updateTime")

_BY_COLLECTION = {k.collection: k for k in KINDS.values()}
_PARENT_KINDS = ("Organization", "Tenant", "Workspace", "SecurityGroup", "Cluster")


def lookup_kind(word: str) -> Kind | None:
    """A kind by name, plural, collection or alias, case-insensitively."""
    w = word.lower()
    for kind in KINDS.values():
        names = {
            kind.name.lower(),
            kind.name.lower() + "s",
            kind.collection,
            kind.list_field.lower(),
            *kind.aliases,
        }
        if w in names:
            return kind
    return None


def is_policy_word(word: str) -> bool:
    return word.lower() in {"policy", "policies", "accesspolicy", "accesspolicies"}


def require_kind(word: str) -> Kind:
    kind = lookup_kind(word)
    if kind is None:
        known = ", ".join(k.name for k in KINDS.values())
        raise MeshctlError(
            f"unknown kind {word!r}; known kinds: {known}, {POLICY_KIND}", Exit.USAGE
        )
    return kind


@dataclass(frozen=True, slots=True)
class Ref:
    """One object: its kind, name, and the names of its parents."""

    kind: Kind
    name: str
    parents: tuple[tuple[Kind, str], ...]

    @property
    def fqn(self) -> str:
        return "/".join(
            [
                *(f"{k.collection}/{n}" for k, n in self.parents),
                f"{self.kind.collection}/{self.name}",
            ]
        )

    @property
    def path(self) -> str:
        return "/v2/" + self.fqn

    @property
    def collection_path(self) -> str:
        return collection_path(self.kind, self.parents)

    def parent_names(self) -> dict[str, str]:
        return {k.metadata_key: n for k, n in self.parents}

    def describe(self) -> str:
        return f"{self.kind.name.lower()} {self.fqn}"


def collection_path(kind: Kind, parents: tuple[tuple[Kind, str], ...]) -> str:
    prefix = "/".join(f"{k.collection}/{n}" for k, n in parents)
    return "/v2/" + (f"{prefix}/" if prefix else "") + kind.collection


def resolve_parents(kind: Kind, names: Mapping[str, str | None]) -> tuple[tuple[Kind, str], ...]:
    """Pick the longest parent chain of ``kind`` whose names are all in ``names``.

    ``names`` maps metadata keys (``organization``, ``tenant``, ``workspace``,
    ``cluster``) to names. Raises a usage error naming what is missing.
    """
    for chain in sorted(kind.chains, key=len, reverse=True):
        values = [names.get(KINDS[p].metadata_key) for p in chain]
        if all(values):
            return tuple((KINDS[p], v) for p, v in zip(chain, values, strict=True) if v)
    needed = " and ".join(KINDS[p].flag for p in min(kind.chains, key=len))
    raise MeshctlError(
        f"a {kind.name} lives under a parent: pass {needed} (or set a default with "
        "meshctl config set-profile), or give its FQN",
        Exit.USAGE,
    )


def parse_fqn(fqn: str) -> Ref:
    """``organizations/o/clusters/c`` -> Ref(Cluster, "c", ((Organization, "o"),))."""
    text = fqn.strip().strip("/")
    if text.startswith("v2/"):
        text = text[3:]
    parts = text.split("/")
    if len(parts) < 2 or len(parts) % 2:
        raise MeshctlError(
            f"{fqn!r} is not an FQN (collection/name pairs such as organizations/o/clusters/c)",
            Exit.USAGE,
        )
    pairs: list[tuple[Kind, str]] = []
    for i in range(0, len(parts), 2):
        kind = _BY_COLLECTION.get(parts[i])
        if kind is None or not parts[i + 1]:
            raise MeshctlError(f"{fqn!r}: unknown collection {parts[i]!r}", Exit.USAGE)
        pairs.append((kind, parts[i + 1]))
    kind, name = pairs[-1]
    chain = tuple(k.name for k, _ in pairs[:-1])
    if chain not in kind.chains:
        raise MeshctlError(f"{fqn!r}: a {kind.name} cannot live there", Exit.USAGE)
    return Ref(kind, name, tuple(pairs[:-1]))


def parent_keys() -> tuple[str, ...]:
    """The metadata keys that can name a parent."""
    return tuple(KINDS[k].metadata_key for k in _PARENT_KINDS)


def policy_path(target: str) -> str:
    """REST path of the access policy of ``target`` (an FQN, ``root`` or ``rbac``)."""
    t = target.strip().strip("/")
    if t in {"", "root", "admin/root"}:
        return "/v2/admin/root/policy"
    if t in {"rbac", "admin/rbac"}:
        return "/v2/admin/rbac/policy"
    return parse_fqn(t).path + "/policy"
