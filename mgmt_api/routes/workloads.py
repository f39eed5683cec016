"""``GET .../clusters/{cluster}/workloads``: the cluster's sidecars, identities,
certificates, config state and callers (:mod:`mgmt_api.service.workloads`).

READ on the cluster. Returned as the service builds it (no response model:
the rows keep the order the console and meshctl show).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from meshplane.kinds_contract import Kind
from mgmt_api.routes.deps import Ctx, Name, Workloads

router = APIRouter()


@router.get(
    "/v2/organizations/{organization}/clusters/{cluster}/workloads",
    tags=[Kind.CLUSTER],
    operation_id="ListClusterWorkloads",
    summary="The cluster's sidecars: identity, certificate expiry, config state, who may call them",
)
def cluster_workloads(
    ctx: Ctx, organization: Name, cluster: Name, workloads: Workloads
) -> dict[str, Any]:
    return workloads.list(ctx, organization, cluster)
