"""``POST /v2/lookup/services``: services a namespace selector would hit."""

from typing import Annotated

from fastapi import APIRouter, Body

from mgmt_api.routes.deps import Ctx, Inventory
from mgmt_api.schemas.inventory import ServiceLookupRequest, ServiceLookupResponse

router = APIRouter()


@router.post(
    "/v2/lookup/services",
    response_model=ServiceLookupResponse,
    response_model_exclude_none=True,
    operation_id="LookupServices",
    tags=["Lookup"],
    summary="Agent-reported services a selector matches, paged (READ on parent and each cluster)",
)
def lookup_services(
    ctx: Ctx, body: Annotated[ServiceLookupRequest, Body()], inventory: Inventory
) -> ServiceLookupResponse:
    services, next_token = inventory.lookup_services(
        ctx,
        body.parent,
        body.selector.names,
        page_size=body.page_size,
        page_token=body.page_token,
    )
    return ServiceLookupResponse(services=services, next_page_token=next_token)
