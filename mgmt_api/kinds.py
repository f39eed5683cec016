"""The registry of resource kinds: collection names, models and list fields.

Routers, the FQN grammar and the service layer all read this one table, so a
later issue adds a kind (with its parents) here and gets CRUD, policies,
permissions, paging, labels, audit and recursive delete for free.
"""

from __future__ import annotations

from dataclasses import dataclass

from mgmt_api import fqn as fqnmod
from mgmt_api.compiler import security_setting
from mgmt_api.schemas import resources as m
from mgmt_api.schemas.base import ApiModel


@dataclass(frozen=True, slots=True)
class KindDef:
    kind: str
    collection: str  # path segment, e.g. "clusters"
    param: str  # path parameter name of this kind, e.g. "cluster"
    body_field: str  # create body wrapper, e.g. "cluster"
    list_field: str  # list response field, e.g. "clusters"
    model: type[ApiModel]
    parents: tuple[str, ...]  # parent kinds (fqn.ROOT_KIND / fqn.RBAC_KIND / a kind)
    protectable: bool = False
    # Fields clients may send but the server owns (ignored on input).
    output_only: frozenset[str] = frozenset()


_COMMON_OUTPUT_ONLY = frozenset({"fqn", "etag", "createTime", "updateTime"})

KINDS: dict[str, KindDef] = {
    k.kind: k
    for k in (
        KindDef(
            "Organization",
            "organizations",
            "organization",
            "organization",
            "organizations",
            m.Organization,
            (fqnmod.ROOT_KIND,),
            protectable=True,
        ),
        KindDef(
            "Tenant",
            "tenants",
            "tenant",
            "tenant",
            "tenants",
            m.Tenant,
            ("Organization",),
            protectable=True,
        ),
        KindDef(
            "Workspace",
            "workspaces",
            "workspace",
            "workspace",
            "workspaces",
            m.Workspace,
            ("Tenant",),
            protectable=True,
        ),
        KindDef(
            "SecurityGroup",
            "securitygroups",
            "securitygroup",
            "securityGroup",
            "securityGroups",
            m.SecurityGroup,
            ("Workspace",),
            protectable=True,
        ),
        KindDef(
            "Cluster",
            "clusters",
            "cluster",
            "cluster",
            "clusters",
            m.Cluster,
            ("Organization",),
            protectable=True,
            output_only=frozenset({"namespaces", "state", "installTemplate", "serviceAccount"}),
        ),
        KindDef(
            "Profile",
            "profiles",
            "profile",
            "profile",
            "profiles",
            m.Profile,
            ("Organization", "Tenant", "Workspace"),
            protectable=True,
        ),
        KindDef(
            "User",
            "users",
            "user",
            "user",
            "users",
            m.User,
            ("Organization", fqnmod.ROOT_KIND),
            output_only=frozenset({"sourceType", "password"}),
        ),
        KindDef(
            "Team",
            "teams",
            "team",
            "team",
            "teams",
            m.Team,
            ("Organization",),
            output_only=frozenset({"sourceType"}),
        ),
        KindDef(
            "ServiceAccount",
            "serviceaccounts",
            "serviceaccount",
            "serviceAccount",
            "serviceAccounts",
            m.ServiceAccount,
            ("Organization", "Cluster"),
            output_only=frozenset({"keys"}),
        ),
        KindDef(
            "BackendTrafficPolicy",
            "backendtrafficpolicies",
            "backendtrafficpolicy",
            "backendTrafficPolicy",
            "backendTrafficPolicies",
            m.BackendTrafficPolicy,
            ("Cluster",),
        ),
        KindDef(
            "ClusterOnboardingConfig",
            "onboarding",
            "onboarding",
            "config",
            "configs",
            m.ClusterOnboardingConfig,
            ("Cluster",),
        ),
        KindDef(
            "SecuritySetting",
            "settings",
            "setting",
            "securitySetting",
            "settings",
            security_setting.SecuritySetting,
            ("SecurityGroup",),
        ),
        KindDef(
            "ExtAuthzPolicy",
            "extauthzpolicies",
            "extauthzpolicy",
            "extAuthzPolicy",
            "extAuthzPolicies",
            m.ExtAuthzPolicy,
            ("SecurityGroup",),
        ),
        KindDef("Role", "rbac", "role", "role", "roles", m.Role, (fqnmod.RBAC_KIND,)),
    )
}

for _k in KINDS.values():
    object.__setattr__(_k, "output_only", _k.output_only | _COMMON_OUTPUT_ONLY)

# Path templates of each kind's parent, for routers: kind -> template of the
# object path (without /v2/), e.g. "organizations/{organization}/clusters/{cluster}".


def item_templates(kind: str) -> list[str]:
    """Every path template (without ``/v2/``) at which objects of ``kind`` live."""
    kdef = KINDS[kind]
    out: list[str] = []
    for parent in kdef.parents:
        if parent == fqnmod.ROOT_KIND:
            out.append(f"{kdef.collection}/{{{kdef.param}}}")
        elif parent == fqnmod.RBAC_KIND:
            out.append(f"rbac/{{{kdef.param}}}")
        else:
            out.extend(f"{p}/{kdef.collection}/{{{kdef.param}}}" for p in item_templates(parent))
    return out


def parent_templates(kind: str) -> list[str]:
    """Templates of the parents (``""`` root, ``"rbac"``), aligned with ``item_templates``."""
    kdef = KINDS[kind]
    out: list[str] = []
    for parent in kdef.parents:
        if parent == fqnmod.ROOT_KIND:
            out.append("")
        elif parent == fqnmod.RBAC_KIND:
            out.append("rbac")
        else:
            out.extend(item_templates(parent))
    return out
