"""``GET .../clusters/{cluster}/status``: has my change reached the proxies?

``GET .../backendtrafficpolicies/{ns}.{name}/status`` is the same view from
the policy's side: the cluster's ratelimit instances only (a snapshot holds
all of the cluster's policies, so "applied" means "this policy's current
content is live there"). Needs READ on the policy.

Shows, per subscribed ratelimit and extauthz instance of the cluster, the
applied snapshot version, whether the last snapshot was ACKed or NACKed (with
the error), the last contact and whether the instance is stale, next to the
version the cluster's current policies compile to. Needs READ on the cluster.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request

from mgmt_api import fqn as fqnmod
from mgmt_api.distribution.hub import Distribution
from mgmt_api.domain import rbac
from mgmt_api.errors import ApiError, Code, not_found
from mgmt_api.routes.deps import call_context, state
from mgmt_api.routes.resources import NAMESPACED_PATTERN
from mgmt_api.service import authz
from mgmt_api.service.resources import CallContext
from mgmt_api.store import repo
from mgmt_api.store.engine import read_tx

router = APIRouter()
Ctx = Annotated[CallContext, Depends(call_context)]
Name = Annotated[str, Path(max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]
PolicyName = Annotated[str, Path(max_length=63, pattern=NAMESPACED_PATTERN)]


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
    request: Request, ctx: Ctx, organization: Name, cluster: Name, policy: PolicyName
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
