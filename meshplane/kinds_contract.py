"""The resource kinds of the ``/v2`` API: their names and where they live (pure data).

This is the one table of the kind tree. The management plane builds its FQN
grammar (:mod:`mgmt_api.fqn`) and its kind registry (:mod:`mgmt_api.kinds`,
which adds each kind's model and behaviour and refuses to start if the two
disagree) on it; meshctl and the console read it for paths, body and list
fields, parents and aliases. meshctl imports no server package, which is
why the table lives here, beside the other contract modules.

An FQN alternates collection and name segments; the REST path of an object
is ``/v2/`` + its FQN. A kind lives under each of its ``parents`` (kinds, or
the two pseudo-kinds :attr:`Kind.ROOT` and :attr:`Kind.ROLE_COLLECTION`:
the root node ``""`` and the ``rbac`` node, which exist only to carry the
root and RBAC access policies).

Kind words are matched case-insensitively, by name, plural, collection, list
field or alias (:func:`lookup`), wherever a client names a kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    """Every kind name the API uses: stored kinds, then the pseudo-kinds."""

    ORGANIZATION = "Organization"
    TENANT = "Tenant"
    WORKSPACE = "Workspace"
    SECURITY_GROUP = "SecurityGroup"
    CLUSTER = "Cluster"
    PROFILE = "Profile"
    CLUSTER_ONBOARDING_CONFIG = "ClusterOnboardingConfig"
    USER = "User"
    TEAM = "Team"
    SERVICE_ACCOUNT = "ServiceAccount"
    BACKEND_TRAFFIC_POLICY = "BackendTrafficPolicy"
    HTTP_ROUTE = "HTTPRoute"
    BACKEND = "Backend"
    SECURITY_SETTING = "SecuritySetting"
    EXT_AUTHZ_POLICY = "ExtAuthzPolicy"
    ROLE = "Role"
    APPROVAL_POLICY = "ApprovalPolicy"
    #: The root node (FQN ``""``): its policy is the root policy.
    ROOT = "Root"
    #: The ``rbac`` node, parent of every Role: its policy is the RBAC policy.
    ROLE_COLLECTION = "RoleCollection"
    #: An object's access policy, as a manifest names it (``kind: AccessPolicy``).
    ACCESS_POLICY = "AccessPolicy"


#: Fields every object carries that the server owns (bookkeeping, not desired state),
#: in the order clients show them.
COMMON_FIELDS = ("fqn", "etag", "createTime", "updateTime")
COMMON_OUTPUT_ONLY = frozenset(COMMON_FIELDS)

#: The words that name an access policy (``meshctl get policy ...``).
POLICY_WORDS = frozenset({"policy", "policies", "accesspolicy", "accesspolicies"})


@dataclass(frozen=True, slots=True)
class KindShape:
    """Where a kind lives and how its REST bodies name it.

    ``server_fields`` are output-only fields beyond the common ones (the
    server or the agents own them); ``write_only`` fields are accepted and
    never returned. ``subject_field`` is the key an access-policy binding
    names a principal of this kind by. ``crud`` is false for the one kind the
    generic CRUD does not serve (:data:`NOT_CRUD`).
    """

    kind: Kind
    collection: str  # path segment: "clusters"
    param: str  # path parameter: "cluster"
    body_field: str  # create body wrapper: "cluster"
    list_field: str  # list response field: "clusters"
    parents: tuple[Kind, ...]
    aliases: tuple[str, ...] = ()
    namespaced: bool = False  # name segment is {namespace}.{name}
    server_fields: frozenset[str] = frozenset()
    write_only: frozenset[str] = frozenset()
    subject_field: str | None = None
    crud: bool = True

    @property
    def output_only(self) -> frozenset[str]:
        """Fields a body may carry back as read and that are then ignored."""
        return COMMON_OUTPUT_ONLY | self.server_fields | self.write_only

    def words(self) -> frozenset[str]:
        """The lower-case words that name this kind."""
        name = self.kind.value.lower()
        return frozenset(
            {name, name + "s", self.collection, self.list_field.lower(), *self.aliases}
        )


_K = Kind
_ORG = (_K.ORGANIZATION,)
_CLUSTER = (_K.CLUSTER,)
_GROUP = (_K.SECURITY_GROUP,)

SHAPES: dict[Kind, KindShape] = {
    s.kind: s
    for s in (
        KindShape(_K.ORGANIZATION, "organizations", "organization", "organization",
                  "organizations", (_K.ROOT,), ("org", "orgs")),
        KindShape(_K.TENANT, "tenants", "tenant", "tenant", "tenants", _ORG, ("tn",)),
        KindShape(_K.WORKSPACE, "workspaces", "workspace", "workspace", "workspaces",
                  (_K.TENANT,), ("ws",)),
        KindShape(_K.SECURITY_GROUP, "securitygroups", "securitygroup", "securityGroup",
                  "securityGroups", (_K.WORKSPACE,), ("sg",)),
        KindShape(_K.CLUSTER, "clusters", "cluster", "cluster", "clusters", _ORG, ("cl",),
                  server_fields=frozenset(
                      {"namespaces", "state", "installTemplate", "serviceAccount"})),
        KindShape(_K.PROFILE, "profiles", "profile", "profile", "profiles",
                  (_K.ORGANIZATION, _K.TENANT, _K.WORKSPACE), ("prof",)),
        KindShape(_K.CLUSTER_ONBOARDING_CONFIG, "onboarding", "onboarding", "config",
                  "configs", _CLUSTER, ("onboardingconfig", "onboardingconfigs")),
        KindShape(_K.USER, "users", "user", "user", "users", (_K.ORGANIZATION, _K.ROOT),
                  server_fields=frozenset({"sourceType"}), write_only=frozenset({"password"}),
                  subject_field="user"),
        KindShape(_K.TEAM, "teams", "team", "team", "teams", _ORG,
                  server_fields=frozenset({"sourceType"}), subject_field="team"),
        KindShape(_K.SERVICE_ACCOUNT, "serviceaccounts", "serviceaccount", "serviceAccount",
                  "serviceAccounts", (_K.ORGANIZATION, _K.CLUSTER), ("sa",),
                  server_fields=frozenset({"keys"}), subject_field="serviceAccount"),
        KindShape(_K.BACKEND_TRAFFIC_POLICY, "backendtrafficpolicies", "backendtrafficpolicy",
                  "backendTrafficPolicy", "backendTrafficPolicies", _CLUSTER, ("btp",),
                  namespaced=True),
        KindShape(_K.HTTP_ROUTE, "httproutes", "httproute", "httpRoute", "httpRoutes",
                  _CLUSTER, ("route", "routes"), namespaced=True),
        KindShape(_K.BACKEND, "backends", "backend", "backend", "backends", _CLUSTER,
                  namespaced=True),
        KindShape(_K.SECURITY_SETTING, "settings", "setting", "securitySetting", "settings",
                  _GROUP, ("securitysettings", "setting")),
        KindShape(_K.EXT_AUTHZ_POLICY, "extauthzpolicies", "extauthzpolicy", "extAuthzPolicy",
                  "extAuthzPolicies", _GROUP, ("eap",)),
        KindShape(_K.ROLE, "rbac", "role", "role", "roles", (_K.ROLE_COLLECTION,), ("roles",)),
        KindShape(_K.APPROVAL_POLICY, "approvals", "approval", "policy", "policies",
                  (_K.ORGANIZATION, _K.CLUSTER), crud=False),
    )
}  # fmt: skip

#: The documented exception to "every kind is served by the generic CRUD":
#: an ApprovalPolicy is not a collection of named objects but the one
#: approval workflow of its target (``{target}/approvals/policy``), whose
#: operations (request, approve, check access) each have their own permission.
#: It is in the FQN tree, so deleting the target deletes it; its routes and
#: service are its own (``/v2/.../approvals``, ``meshctl approvals``).
NOT_CRUD = frozenset(k for k, s in SHAPES.items() if not s.crud)

#: The kinds the generic CRUD serves (and meshctl's get/apply/delete know).
CRUD_KINDS: tuple[KindShape, ...] = tuple(s for s in SHAPES.values() if s.crud)

#: The kinds whose objects can be named in access-policy bindings, by subject field.
SUBJECT_KINDS: dict[str, Kind] = {
    s.subject_field: s.kind for s in SHAPES.values() if s.subject_field is not None
}

#: The kinds other kinds live under (a client names them as parents: ``--org``).
PARENT_KINDS: tuple[Kind, ...] = tuple(
    dict.fromkeys(p for s in CRUD_KINDS for p in s.parents if p in SHAPES)
)

#: Collections whose objects are Kubernetes-namespaced (``{namespace}.{name}``).
NAMESPACED_COLLECTIONS = frozenset(s.collection for s in SHAPES.values() if s.namespaced)


def children() -> dict[Kind, dict[str, Kind]]:
    """parent kind -> {collection segment: child kind}: the FQN grammar's table."""
    out: dict[Kind, dict[str, Kind]] = {_K.ROOT: {}, _K.ROLE_COLLECTION: {}}
    for shape in SHAPES.values():
        for parent in shape.parents:
            out.setdefault(parent, {})[shape.collection] = shape.kind
    return out


def chains(kind: Kind) -> tuple[tuple[Kind, ...], ...]:
    """Every chain of parent kinds under which ``kind`` lives, outermost first.

    The pseudo-kinds contribute the empty chain: an Organization's is ``()``,
    a Workspace's ``(Organization, Tenant)``; a User has ``(Organization,)``
    and ``()``.
    """
    out: list[tuple[Kind, ...]] = []
    for parent in SHAPES[kind].parents:
        if parent in (_K.ROOT, _K.ROLE_COLLECTION):
            out.append(())
        else:
            out.extend((*chain, parent) for chain in chains(parent))
    return tuple(out)


def lookup(word: str) -> KindShape | None:
    """The CRUD kind ``word`` names (name, plural, collection, list field or alias),
    case-insensitively; None for anything else (an access policy included)."""
    w = word.strip().lower()
    return next((s for s in CRUD_KINDS if w in s.words()), None)


def is_policy_word(word: str) -> bool:
    """Whether ``word`` names an access policy (``AccessPolicy``, ``policies``, ...)."""
    return word.strip().lower() in POLICY_WORDS
