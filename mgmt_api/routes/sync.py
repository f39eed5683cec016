"""Directory sync on demand: ``POST /v2/organizations/{org}:sync``, and its last results.

Permission: SET_POLICY on the organization for the kind ``DirectorySync``.
A sync rewrites team memberships, and so everyone's grants: that is
SET_POLICY's weight. Being its own kind, it can be granted alone with a
custom role (``rules: [{types: [{kinds: [DirectorySync]}], permissions:
[SET_POLICY]}]``); ``rbac/admin`` on the organization includes it. Reading
the last results needs READ for the same kind.

Only the organizations listed in ``spec.identityProvider.sync.organizations``
can be synced, so an organization admin cannot copy the company directory
into an organization of their own.

A run whose directory read failed changed nothing (the last good state
stays) and answers 503 UNAVAILABLE with the reason; a run where some
records could not be written answers 200 with ``ok: false`` and the failed
IDs. Both are audited and kept for ``GET .../directorySync``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request

from mgmt_api.domain import rbac
from mgmt_api.errors import ApiError, Code, not_found
from mgmt_api.identity.runtime import IdentityRuntime
from mgmt_api.identity.sql_store import org_fqn
from mgmt_api.routes.deps import call_context
from mgmt_api.service import authz
from mgmt_api.service.resources import CallContext
from mgmt_api.store import repo
from mgmt_api.store.engine import read_tx, write_tx

router = APIRouter(tags=["DirectorySync"])
Ctx = Annotated[CallContext, Depends(call_context)]
OrgName = Annotated[str, Path(max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]
KIND = "DirectorySync"


def _runtime(request: Request) -> IdentityRuntime:
    rt: IdentityRuntime = request.app.state.identity
    return rt


def _authorize(rt: IdentityRuntime, ctx: CallContext, org: str, permission: str) -> None:
    with read_tx(rt.engine) as conn:
        authz.require(conn, ctx.principal, org_fqn(org), KIND, permission)
        if not repo.exists(conn, org_fqn(org)):
            raise not_found(org_fqn(org))
    if org not in rt.syncs:
        raise ApiError(
            Code.FAILED_PRECONDITION,
            f"directory sync is not configured for organization {org!r} (list it in "
            "spec.identityProvider.sync.organizations of the install config)",
            metadata={"reason": "sync_not_configured"},
        )


@router.post("/v2/organizations/{organization}:sync", operation_id="SyncOrganization")
async def sync_organization(request: Request, ctx: Ctx, organization: OrgName) -> dict[str, Any]:
    """Synchronize the organization's users and teams from the directory now."""
    rt = _runtime(request)
    _authorize(rt, ctx, organization, rbac.SET_POLICY)
    result = await rt.sync_now(organization)
    body = result.to_json()
    with write_tx(rt.engine) as conn:
        repo.audit(
            conn,
            organization=organization,
            fqn=org_fqn(organization),
            kind=KIND,
            operation="SYNC",
            actor=ctx.principal.fqn,
            message=f"directory sync of {org_fqn(organization)} from {result.source_type}: "
            + ("ok" if result.ok else str(result.error)),
            properties={"ok": result.ok, "users": body["users"], "teams": body["teams"]},
        )
    read_failed = not result.ok and not (len(result.failed_users) + len(result.failed_teams))
    if read_failed:
        raise ApiError(
            Code.UNAVAILABLE,
            str(result.error),
            metadata={"reason": "directory_unavailable", "sourceType": result.source_type},
        )
    return body


@router.get("/v2/organizations/{organization}/directorySync", operation_id="GetDirectorySync")
def directory_sync_status(request: Request, ctx: Ctx, organization: OrgName) -> dict[str, Any]:
    """The last sync result of the organization and its last successful one."""
    rt = _runtime(request)
    _authorize(rt, ctx, organization, rbac.READ)
    sync = rt.syncs[organization]
    assert rt.runs is not None
    return {
        "organization": organization,
        "sourceType": sync.source.source_type,
        "intervalSeconds": sync.interval_s,
        **rt.runs.get(organization),
    }
