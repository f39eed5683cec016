"""``POST /v2/organizations/{organization}/cleanupresources`` (spec 4.6)."""

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request
from pydantic import Field

from mgmt_api.routes.approvals import organization_fqn
from mgmt_api.routes.deps import call_context, state
from mgmt_api.schemas.base import ApiModel
from mgmt_api.service.cleanup import CleanupService
from mgmt_api.service.resources import CallContext

router = APIRouter()
Ctx = Annotated[CallContext, Depends(call_context)]
Organization = Annotated[str, Depends(organization_fqn)]


class CleanupResourcesRequest(ApiModel):
    apply: bool = Field(default=False, description="false: dry run, nothing changes.")


class CleanupItem(ApiModel):
    fqn: str
    kind: str
    reason: str


class CleanupResourcesResponse(ApiModel):
    apply: bool
    changes: list[CleanupItem] = Field(
        description="Deletions: would be applied (dry run) or were applied (apply)."
    )
    skipped: list[CleanupItem] = Field(description="Unused but protected or still holding objects.")


@router.post(
    "/v2/organizations/{organization}/cleanupresources",
    response_model=CleanupResourcesResponse,
    operation_id="CleanupResources",
    tags=["Organization"],
    summary="Find unused objects; delete them with apply=true (kind CleanupResources: READ/DELETE)",
)
def cleanup_resources(
    request: Request,
    ctx: Ctx,
    organization: Organization,
    body: Annotated[CleanupResourcesRequest, Body()],
) -> dict[str, Any]:
    resources = state(request).resources
    service = CleanupService(resources.engine, resources.onboarding, resources.on_commit)
    return service.run(ctx, organization, apply=body.apply)
