"""``POST /v2/organizations/{organization}/cleanupresources`` (spec 4.6)."""

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request
from pydantic import Field

from mgmt_api.routes.deps import call_context, organization_fqn, state
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
    skipped: list[CleanupItem] = Field(
        description=(
            "Unused but protected (itself or below), still holding objects, or (security "
            "groups) selecting clusters whose agents never reported or are stale."
        )
    )


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
    service = CleanupService(
        resources.engine,
        resources.onboarding,
        resources.on_commit,
        stale_after_seconds=resources.stale_after_seconds,
    )
    return service.run(ctx, organization, apply=body.apply)
