"""``PUT .../clusters/{cluster}/inventory``: a cluster agent's report (designed).

Authenticated like every endpoint; only a bearer token signed with a key of
this cluster's agent service account (``.../clusters/{cluster}/serviceaccounts/agent``)
is accepted, the same credential the policy distribution admits.
"""

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request

from mgmt_api.routes.deps import call_context, cluster_fqn, state
from mgmt_api.schemas.inventory import ClusterStateView, InventoryReport
from mgmt_api.service.inventory import InventoryService
from mgmt_api.service.resources import CallContext

router = APIRouter()
Ctx = Annotated[CallContext, Depends(call_context)]
Cluster = Annotated[str, Depends(cluster_fqn)]


@router.put(
    "/v2/organizations/{organization}/clusters/{cluster}/inventory",
    response_model=ClusterStateView,
    response_model_exclude_none=True,
    operation_id="ReportClusterInventory",
    tags=["Cluster"],
    summary="The cluster agent's namespaces, services, workloads and state (agent key only)",
)
def report_inventory(
    request: Request,
    ctx: Ctx,
    cluster: Cluster,
    body: Annotated[InventoryReport, Body()],
) -> dict[str, Any]:
    resources = state(request).resources
    return InventoryService(resources.engine, resources.stale_after_seconds).report(
        ctx, cluster, body
    )
