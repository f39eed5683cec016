"""``POST /v2/lookup/services`` (spec 4.2): services a namespace selector would hit."""

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request

from mgmt_api.routes.deps import call_context, state
from mgmt_api.schemas.inventory import ServiceLookupRequest, ServiceLookupResponse
from mgmt_api.service.inventory import InventoryService
from mgmt_api.service.resources import CallContext

router = APIRouter()
Ctx = Annotated[CallContext, Depends(call_context)]


@router.post(
    "/v2/lookup/services",
    response_model=ServiceLookupResponse,
    response_model_exclude_none=True,
    operation_id="LookupServices",
    tags=["Lookup"],
    summary="Agent-reported services a selector matches, paged (READ on parent and each cluster)",
)
def lookup_services(
    request: Request, ctx: Ctx, body: Annotated[ServiceLookupRequest, Body()]
) -> dict[str, Any]:
    resources = state(request).resources
    service = InventoryService(resources.engine, resources.stale_after_seconds)
    services, next_token = service.lookup_services(
        ctx,
        body.parent,
        body.selector.names,
        page_size=body.page_size,
        page_token=body.page_token,
    )
    return {"services": services, "nextPageToken": next_token}
