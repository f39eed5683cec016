"""``PUT .../clusters/{cluster}/inventory``: a cluster agent's report (designed).

Authenticated like every endpoint; only a bearer token signed with a key of
this cluster's agent service account (``.../clusters/{cluster}/serviceaccounts/agent``)
is accepted, as the table of ``mgmt_api.domain.cluster_accounts`` says (the
agent holds no role).
"""

from typing import Annotated

from fastapi import APIRouter, Body

from meshplane.kinds_contract import Kind
from mgmt_api.routes.deps import ClusterFqn, Ctx, Inventory
from mgmt_api.schemas.inventory import ClusterStateView, InventoryReport

router = APIRouter()


@router.put(
    "/v2/organizations/{organization}/clusters/{cluster}/inventory",
    response_model=ClusterStateView,
    response_model_exclude_none=True,
    operation_id="ReportClusterInventory",
    tags=[Kind.CLUSTER],
    summary="The cluster agent's namespaces, services, workloads and state (agent key only)",
)
def report_inventory(
    ctx: Ctx,
    cluster: ClusterFqn,
    body: Annotated[InventoryReport, Body()],
    inventory: Inventory,
) -> ClusterStateView:
    return inventory.report(ctx, cluster, body)
