"""``GET .../clusters/{cluster}/status``: has my change reached the proxies?

``GET .../backendtrafficpolicies/{ns}.{name}/status`` is the same view from
the policy's side: the cluster's ratelimit instances only (a snapshot holds
all of the cluster's policies, so "applied" means "this policy's current
content is live there"). Needs READ on the policy.

``GET .../securitygroups/{g}/extauthzpolicies/{name}/status`` and
``GET .../securitygroups/{g}/settings/{name}/status`` do the same for the
extauthz side: a group reaches every cluster its namespace selector (or its
workspace's) names, so the view has one entry per such cluster, with the
cluster's desired extauthz version and its extauthz instances. Needs READ on
the policy (or setting).

Shows, per subscribed ratelimit and extauthz instance of the cluster, the
applied snapshot version, whether the last snapshot was ACKed or NACKed (with
the error), the last contact and whether the instance is stale, next to the
version the cluster's current policies compile to. Needs READ on the cluster.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from mgmt_api import fqn as fqnmod
from mgmt_api.compiler.extauthz import policy_name
from mgmt_api.distribution import selection
from mgmt_api.distribution.hub import Distribution
from mgmt_api.domain import rbac
from mgmt_api.errors import ApiError, Code, not_found
from mgmt_api.routes.deps import Name, NamespacedName, call_context, state
from mgmt_api.service import authz
from mgmt_api.service.resources import CallContext
from mgmt_api.store import repo
from mgmt_api.store.engine import read_tx

router = APIRouter()
Ctx = Annotated[CallContext, Depends(call_context)]


@router.get(
    "/v2/organizations/{organization}/clusters/{cluster}/status",
    tags=["Cluster"],
    operation_id="GetClusterStatus",
    summary="Policy distribution status of the cluster's ratelimit and extauthz instances",
)
def cluster_status(request: Request, ctx: Ctx, organization: Name, cluster: Name) -> dict[str, Any]:
    fqn = f"organizations/{organization}/clusters/{cluster}"
    return _distribution(request, ctx, fqn, "Cluster").cluster_status(organization, cluster)


def _distribution(request: Request, ctx: CallContext, fqn: str, kind: str) -> Distribution:
    """READ on ``fqn`` (which must exist), and the distribution plane."""
    fqnmod.parse(fqn)
    st = state(request)
    with read_tx(st.resources.engine) as conn:
        authz.require(conn, ctx.principal, fqn, kind, rbac.READ)
        if not repo.exists(conn, fqn):
            raise not_found(fqn)
    if st.distribution is None:
        raise ApiError(Code.FAILED_PRECONDITION, "policy distribution is disabled on this server")
    return st.distribution


@router.get(
    "/v2/organizations/{organization}/clusters/{cluster}/backendtrafficpolicies/{policy}/status",
    tags=["BackendTrafficPolicy"],
    operation_id="GetBackendTrafficPolicyStatus",
    summary="Which ratelimit instances of the cluster enforce the policy's current content",
)
def traffic_policy_status(
    request: Request, ctx: Ctx, organization: Name, cluster: Name, policy: NamespacedName
) -> dict[str, Any]:
    fqn = f"organizations/{organization}/clusters/{cluster}/backendtrafficpolicies/{policy}"
    status = _distribution(request, ctx, fqn, "BackendTrafficPolicy").cluster_status(
        organization, cluster
    )
    return {
        "fqn": fqn,
        "desiredVersion": status["desiredVersions"]["ratelimit"],
        "instances": [i for i in status["instances"] if i["kind"] == "ratelimit"],
    }


def _group_clusters(request: Request, organization: str, group_fqn: str) -> list[str]:
    """The existing clusters the security group's selector reaches, by name."""
    org = f"organizations/{organization}"
    with read_tx(state(request).resources.engine) as conn:
        group = repo.get(conn, group_fqn)
        if group is None:
            raise not_found(group_fqn)
        names = selection.selected_clusters(selection.group_selector(conn, group))
        if names == ("*",):
            return [c.name for c in selection.children(conn, org, "Cluster")]
        return [n for n in names if repo.exists(conn, fqnmod.cluster_fqn(organization, n))]


def _extauthz_view(
    request: Request, ctx: CallContext, organization: str, group_fqn: str, *, fqn: str, kind: str
) -> dict[str, Any]:
    distribution = _distribution(request, ctx, fqn, kind)
    clusters = _group_clusters(request, organization, group_fqn)
    return {
        "fqn": fqn,
        "clusters": [distribution.kind_status(organization, c, "extauthz") for c in clusters],
    }


GROUP = (
    "/v2/organizations/{organization}/tenants/{tenant}/workspaces/{workspace}"
    "/securitygroups/{group}"
)


def _group_fqn(organization: str, tenant: str, workspace: str, group: str) -> str:
    return (
        f"organizations/{organization}/tenants/{tenant}/workspaces/{workspace}"
        f"/securitygroups/{group}"
    )


@router.get(
    GROUP + "/extauthzpolicies/{policy}/status",
    tags=["ExtAuthzPolicy"],
    operation_id="GetExtAuthzPolicyStatus",
    summary="Which extauthz instances of the clusters the group reaches enforce the policy",
)
def extauthz_policy_status(  # noqa: PLR0917 - one parameter per path segment
    request: Request,
    ctx: Ctx,
    organization: Name,
    tenant: Name,
    workspace: Name,
    group: Name,
    policy: Name,
) -> dict[str, Any]:
    group_fqn = _group_fqn(organization, tenant, workspace, group)
    fqn = f"{group_fqn}/extauthzpolicies/{policy}"
    view = _extauthz_view(request, ctx, organization, group_fqn, fqn=fqn, kind="ExtAuthzPolicy")
    # The name the ext_authz file gives it: the meshplane.policy context extension.
    view["policyName"] = policy_name(group_fqn, policy)
    return view


@router.get(
    GROUP + "/settings/{setting}/status",
    tags=["SecuritySetting"],
    operation_id="GetSecuritySettingStatus",
    summary="The extauthz instances of the clusters the setting's group reaches",
)
def security_setting_status(  # noqa: PLR0917 - one parameter per path segment
    request: Request,
    ctx: Ctx,
    organization: Name,
    tenant: Name,
    workspace: Name,
    group: Name,
    setting: Name,
) -> dict[str, Any]:
    group_fqn = _group_fqn(organization, tenant, workspace, group)
    fqn = f"{group_fqn}/settings/{setting}"
    return _extauthz_view(request, ctx, organization, group_fqn, fqn=fqn, kind="SecuritySetting")
