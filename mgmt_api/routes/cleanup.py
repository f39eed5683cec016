"""``POST /v2/organizations/{organization}/cleanupresources``."""

from typing import Annotated

from fastapi import APIRouter, Body

from meshplane.kinds_contract import Kind
from mgmt_api.routes.deps import Cleanup, Ctx, OrganizationFqn
from mgmt_api.schemas.cleanup import CleanupResourcesRequest, CleanupResourcesResponse

router = APIRouter()


@router.post(
    "/v2/organizations/{organization}/cleanupresources",
    response_model=CleanupResourcesResponse,
    operation_id="CleanupResources",
    tags=[Kind.ORGANIZATION],
    summary="Find unused objects; delete them with apply=true (kind CleanupResources: READ/DELETE)",
)
def cleanup_resources(
    ctx: Ctx,
    organization: OrganizationFqn,
    body: Annotated[CleanupResourcesRequest, Body()],
    cleanup: Cleanup,
) -> CleanupResourcesResponse:
    return cleanup.run(ctx, organization, apply=body.apply)
