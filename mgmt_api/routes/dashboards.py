"""``GET /v2/dashboards`` and ``GET /v2/dashboards/{name}`` (docs/dashboards.md).

The dashboards are package data, the same for every caller and free of any
tenant's data, so any authenticated principal may read them: no RBAC object
guards them, but anonymous calls are refused like everywhere else.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from mgmt_api.dashboards import get_dashboard, list_dashboards
from mgmt_api.errors import not_found
from mgmt_api.routes.deps import Ctx, Name
from mgmt_api.schemas.base import ApiModel

router = APIRouter()


class Dashboard(ApiModel):
    name: str
    description: str


class ListDashboardsResponse(ApiModel):
    dashboards: list[Dashboard]


@router.get(
    "/v2/dashboards",
    response_model=ListDashboardsResponse,
    tags=["Dashboards"],
    operation_id="ListDashboards",
    summary="Names and descriptions of the shipped Grafana dashboards",
)
def dashboards(_ctx: Ctx) -> dict[str, Any]:
    return {"dashboards": list_dashboards()}


@router.get(
    "/v2/dashboards/{name}",
    tags=["Dashboards"],
    operation_id="GetDashboard",
    summary="A Grafana dashboard model, byte for byte as shipped, ready for import",
    responses={200: {"content": {"application/json": {"schema": {"type": "object"}}}}},
)
def dashboard(_ctx: Ctx, name: Name) -> Response:
    body = get_dashboard(name)
    if body is None:
        raise not_found(f"dashboards/{name}")
    return Response(body, media_type="application/json")
