"""Global policies, session tokens, audit logs, probes and metrics (OIDC: routes/oidc.py)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from mgmt_api import fqn as fqnmod
from mgmt_api.domain import rbac
from mgmt_api.errors import ApiError, Code, invalid, not_found, unauthenticated
from mgmt_api.routes.deps import call_context, client_address, state
from mgmt_api.routes.resources import put_access_policy
from mgmt_api.schemas import resources as m
from mgmt_api.schemas.base import Empty
from mgmt_api.service import authz
from mgmt_api.service.resources import CallContext, rfc3339
from mgmt_api.store import repo
from mgmt_api.store.engine import read_tx

router = APIRouter()
Ctx = Annotated[CallContext, Depends(call_context)]


def _global_policy(path: str, fqn: str, what: str) -> None:
    def get_policy(request: Request, ctx: Ctx) -> dict[str, Any]:
        return state(request).policies.get(ctx, fqn)

    def put_policy(
        request: Request, ctx: Ctx, body: Annotated[m.AccessPolicy, Body()]
    ) -> dict[str, Any]:
        put_access_policy(request, ctx, fqn, body)
        return {}

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


_global_policy("/v2/admin/root/policy", fqnmod.ROOT, "Root")
_global_policy("/v2/admin/rbac/policy", fqnmod.RBAC, "Rbac")


@router.post(
    "/v2/auth/token", response_model=m.TokenResponse, tags=["Auth"], operation_id="CreateToken"
)
def create_token(request: Request) -> dict[str, Any]:
    """Exchange HTTP Basic credentials for a bearer session token (1 hour)."""
    header = request.headers.get("authorization") or ""
    if not header.lower().startswith("basic "):
        raise unauthenticated("Basic credentials required to obtain a token")
    st = state(request)
    principal = st.authn.authenticate(header, client_address(request))
    token, ttl = st.authn.mint(principal)
    return {"accessToken": token, "tokenType": "Bearer", "expiresIn": ttl, "subject": principal.fqn}


@router.get(
    "/v2/organizations/{organization}/auditlogs",
    response_model=m.AuditLogList,
    tags=["Audit"],
    operation_id="ListAuditLogs",
)
def list_audit_logs(
    request: Request,
    ctx: Ctx,
    organization: Annotated[str, Path(max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")],
    page_size: Annotated[int, Query(alias="pageSize", ge=1, le=1000)] = 100,
    page_token: Annotated[str, Query(alias="pageToken", max_length=32)] = "",
    *,
    kind: Annotated[str, Query(max_length=64, pattern=r"^[A-Za-z]*$")] = "",
    operation: Annotated[str, Query(max_length=64, pattern=r"^[A-Z_]*$")] = "",
    triggered_by: Annotated[str, Query(alias="triggeredBy", max_length=512)] = "",
    fqn_prefix: Annotated[str, Query(alias="fqnPrefix", max_length=1024)] = "",
) -> dict[str, Any]:
    """Who did what to which FQN and when, newest first (needs READ on the organization).

    Filters (all optional, combined): ``kind``, ``operation``, ``triggeredBy``
    (the actor's FQN) and ``fqnPrefix`` (an object and everything below it)."""
    fqnmod.validate_name(organization, "organization")
    org_fqn = f"organizations/{organization}"
    before: int | None = None
    if page_token:
        if not page_token.isdigit():
            raise invalid("pageToken", "is not a token this server issued")
        before = int(page_token)
    with read_tx(state(request).resources.engine) as conn:
        authz.require(conn, ctx.principal, org_fqn, "Organization", rbac.READ)
        if not repo.exists(conn, org_fqn):
            raise not_found(org_fqn)
        filters = {
            name: value
            for name, value in (
                ("kind", kind),
                ("operation", operation),
                ("triggeredBy", triggered_by),
                ("fqnPrefix", fqn_prefix.strip("/")),
            )
            if value
        }
        records = repo.list_audit(conn, organization, before, page_size + 1, filters)
    more = len(records) > page_size
    records = records[:page_size]
    return {
        "auditLogs": [
            {
                "id": str(r.id),
                "createTime": rfc3339(r.time),
                "kind": r.kind,
                "operation": r.operation,
                "fqn": r.fqn,
                "triggeredBy": r.actor,
                "message": r.message,
                "properties": r.properties,
            }
            for r in records
        ],
        "nextPageToken": str(records[-1].id) if more else "",
    }


@router.get("/healthz", include_in_schema=False)
def healthz() -> dict[str, str]:
    """Liveness: the process serves requests."""
    return {"status": "ok"}


@router.get("/readyz", include_in_schema=False)
def readyz(request: Request) -> Response:
    """Readiness: the store answers."""
    try:
        with read_tx(state(request).resources.engine) as conn:
            repo.current_revision(conn)
    except Exception:
        body = ApiError(Code.UNAVAILABLE, "store unavailable").body()
        return Response(json.dumps(body), status_code=503, media_type="application/json")
    return Response('{"status":"ok"}', media_type="application/json")


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    """Prometheus metrics; any valid credential unless MESHPLANE_PUBLIC_METRICS=1."""
    st = state(request)
    if not st.settings.public_metrics:
        call_context(request)
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)
