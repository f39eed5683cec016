"""Has my change reached the proxies? The status views (:mod:`mgmt_api.service.status`).

- ``GET .../clusters/{cluster}/status``: every subscribed ratelimit and
  extauthz instance and gateway of the cluster (READ on the cluster);
- ``GET .../backendtrafficpolicies/{ns}.{name}/status``: the policy's
  cluster's ratelimit instances and gateways (READ on the policy);
- ``GET .../securitygroups/{g}/extauthzpolicies/{name}/status`` and
  ``.../securitygroups/{g}/settings/{name}/status``: every cluster the group
  reaches, with its extauthz instances and gateways (READ on the policy or setting).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from meshplane.kinds_contract import Kind
from mgmt_api import fqn as fqnmod
from mgmt_api.routes.deps import Ctx, Name, NamespacedName, SecurityGroupFqn, Status

router = APIRouter()

# The services return TypedDicts (mgmt_api.service.status); the routes hand them on
# as plain dicts so FastAPI serializes them as before (no response model: same
# OpenAPI document, same key order).

GROUP = (
    "/v2/organizations/{organization}/tenants/{tenant}/workspaces/{workspace}"
    "/securitygroups/{group}"
)


@router.get(
    "/v2/organizations/{organization}/clusters/{cluster}/status",
    tags=[Kind.CLUSTER],
    operation_id="GetClusterStatus",
    summary="Distribution status of the cluster's ratelimit, extauthz and gateway instances",
)
def cluster_status(ctx: Ctx, organization: Name, cluster: Name, status: Status) -> dict[str, Any]:
    return dict(status.cluster(ctx, organization, cluster))


@router.get(
    "/v2/organizations/{organization}/clusters/{cluster}/backendtrafficpolicies/{policy}/status",
    tags=[Kind.BACKEND_TRAFFIC_POLICY],
    operation_id="GetBackendTrafficPolicyStatus",
    summary="Which ratelimit instances and gateways of the cluster run the policy's content",
)
def traffic_policy_status(
    ctx: Ctx, organization: Name, cluster: Name, policy: NamespacedName, status: Status
) -> dict[str, Any]:
    fqn = f"{fqnmod.cluster_fqn(organization, cluster)}/backendtrafficpolicies/{policy}"
    return dict(status.traffic_policy(ctx, fqn))


@router.get(
    GROUP + "/extauthzpolicies/{policy}/status",
    tags=[Kind.EXT_AUTHZ_POLICY],
    operation_id="GetExtAuthzPolicyStatus",
    summary="Which extauthz instances and gateways of the group's clusters run the policy",
)
def extauthz_policy_status(
    ctx: Ctx, group: SecurityGroupFqn, policy: Name, status: Status
) -> dict[str, Any]:
    return dict(status.ext_authz_policy(ctx, f"{group}/extauthzpolicies/{policy}"))


@router.get(
    GROUP + "/settings/{setting}/status",
    tags=[Kind.SECURITY_SETTING],
    operation_id="GetSecuritySettingStatus",
    summary="The extauthz instances and gateways of the clusters the setting's group reaches",
)
def security_setting_status(
    ctx: Ctx, group: SecurityGroupFqn, setting: Name, status: Status
) -> dict[str, Any]:
    return dict(status.group_object(ctx, f"{group}/settings/{setting}"))
