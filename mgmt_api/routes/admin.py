"""Global policies, session tokens, audit logs, probes and metrics (OIDC: routes/oidc.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

from fastapi import APIRouter, Body, Query, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from meshplane.kinds_contract import Kind
from mgmt_api import fqn as fqnmod
from mgmt_api.errors import ApiError, Code, unauthenticated
from mgmt_api.routes.deps import Audit, Ctx, Name, call_context, services
from mgmt_api.routes.resources import put_access_policy
from mgmt_api.schemas import resources as m
from mgmt_api.schemas.base import Empty
from mgmt_api.service.audit import AuditFilters

router = APIRouter()


def _global_policy(path: str, fqn: str, what: str) -> None:
    def get_policy(request: Request, ctx: Ctx) -> m.AccessPolicy:
        return services(request).policies.get(ctx, fqn)

    def put_policy(
        request: Request, ctx: Ctx, body: Annotated[m.SetAccessPolicyRequest, Body()]
    ) -> Empty:
        put_access_policy(request, ctx, fqn, body)
        return Empty()

    router.add_api_route(
        path,
        get_policy,
        methods=["GET"],
        response_model=m.AccessPolicy,
        response_model_exclude_none=True,
        operation_id=f"Get{what}Policy",
        tags=["Policy"],
        summary=f"The {what} policy (needs SET_POLICY)",
    )
    router.add_api_route(
        path,
        put_policy,
        methods=["PUT"],
        response_model=Empty,
        operation_id=f"Set{what}Policy",
        tags=["Policy"],
        summary=f"Replace the {what} policy (etag required)",
    )


_global_policy("/v2/admin/root/policy", fqnmod.ROOT, Kind.ROOT)
_global_policy("/v2/admin/rbac/policy", fqnmod.RBAC, "Rbac")


@router.post(
    "/v2/auth/token", response_model=m.TokenResponse, tags=["Auth"], operation_id="CreateToken"
)
def create_token(request: Request) -> m.TokenResponse:
    """Exchange HTTP Basic credentials for a bearer session token (1 hour)."""
    header = request.headers.get("authorization") or ""
    if not header.lower().startswith("basic "):
        raise unauthenticated("Basic credentials required to obtain a token")
    principal = call_context(request).principal  # checked once, by the middleware
    token, ttl = services(request).authn.mint(principal)
    return m.TokenResponse.model_validate(
        {"accessToken": token, "tokenType": "Bearer", "expiresIn": ttl, "subject": principal.fqn}
    )


@router.get(
    "/v2/organizations/{organization}/auditlogs",
    response_model=m.AuditLogList,
    tags=["Audit"],
    operation_id="ListAuditLogs",
)
def list_audit_logs(
    ctx: Ctx,
    organization: Name,
    audit: Audit,
    page_size: Annotated[int, Query(alias="pageSize", ge=1, le=1000)] = 100,
    page_token: Annotated[str, Query(alias="pageToken", max_length=32)] = "",
    *,
    kind: Annotated[str, Query(max_length=64, pattern=r"^[A-Za-z]*$")] = "",
    operation: Annotated[str, Query(max_length=64, pattern=r"^[A-Z_]*$")] = "",
    triggered_by: Annotated[str, Query(alias="triggeredBy", max_length=512)] = "",
    fqn_prefix: Annotated[str, Query(alias="fqnPrefix", max_length=1024)] = "",
) -> m.AuditLogList:
    """Who did what to which FQN and when, newest first (needs READ on the organization).

    Filters (all optional, combined): ``kind``, ``operation``, ``triggeredBy``
    (the actor's FQN) and ``fqnPrefix`` (an object and everything below it)."""
    filters = AuditFilters(kind, operation, triggered_by, fqn_prefix.strip("/"))
    return audit.list(
        ctx, organization, page_size=page_size, page_token=page_token, filters=filters
    )


@router.get("/healthz", include_in_schema=False)
def healthz() -> dict[str, str]:
    """Liveness: the process serves requests."""
    return {"status": "ok"}


@router.get("/readyz", include_in_schema=False)
async def readyz(request: Request) -> Response:
    """Readiness: the store answers."""
    try:
        await asyncio.to_thread(services(request).uow.current_revision)
    except Exception:
        body = ApiError(Code.UNAVAILABLE, "store unavailable").body()
        return Response(json.dumps(body), status_code=503, media_type="application/json")
    return Response('{"status":"ok"}', media_type="application/json")


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    """Prometheus metrics; any valid credential unless MESHPLANE_PUBLIC_METRICS=1."""
    if not services(request).settings.public_metrics:
        call_context(request)
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)
