"""``POST /v2/organizations/{organization}/cleanupresources``."""

from typing import Annotated, Any

from fastapi import APIRouter, Body
from pydantic import Field

from meshplane.kinds_contract import Kind
from mgmt_api.routes.deps import Cleanup, Ctx, OrganizationFqn
from mgmt_api.schemas.base import ApiModel

router = APIRouter()


class CleanupResourcesRequest(ApiModel):
    apply: bool = Field(default=False, description="false: dry run, nothing changes.")


class CleanupItem(ApiModel):
    fqn: str
    kind: str
    reason: str


class CleanupResourcesResponse(ApiModel):
    apply: bool
    changes: list[CleanupItem] = Field(
        description="Deletions, and deleted principals removed from the bindings and teams "
        "still naming them: would be applied (dry run) or were applied (apply)."
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
    tags=[Kind.ORGANIZATION],
    summary="Find unused objects; delete them with apply=true (kind CleanupResources: READ/DELETE)",
)
def cleanup_resources(
    ctx: Ctx,
    organization: OrganizationFqn,
    body: Annotated[CleanupResourcesRequest, Body()],
    cleanup: Cleanup,
) -> dict[str, Any]:
    return cleanup.run(ctx, organization, apply=body.apply)
