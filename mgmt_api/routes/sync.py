"""Directory sync on demand: ``POST /v2/organizations/{org}:sync``, and its last results.

Two forms, one reconcile (``identity.sync.runner.run_sync``):

* **pull** (no body): read the configured source (Microsoft Graph or LDAP)
  now. Only the organizations listed in
  ``spec.identityProvider.sync.organizations`` can be synced this way, so
  an organization admin cannot copy the company directory into an
  organization of their own.
* **push** (a ``SyncOrganization`` body, docs/identity.md:
  ``{sourceType, users[], teams[]}``): for identity providers without a
  pull source. The body is the whole directory: users and teams of that
  ``sourceType`` left out are deleted, memberships become exact. It needs no
  configured source. A ``sourceType`` the organization is already pulled
  from is refused: two writers of one source would undo each other.

Permission: SET_POLICY on the organization for the kind ``DirectorySync``.
A sync rewrites team memberships, and so everyone's grants: that is
SET_POLICY's weight. Being its own kind, it can be granted alone with a
custom role (``rules: [{types: [{kinds: [DirectorySync]}], permissions:
[SET_POLICY]}]``); ``rbac/admin`` on the organization includes it. Reading
the last results needs READ for the same kind.

Outcomes: a run whose directory read failed changed nothing (the last good
state stays) and answers 503 UNAVAILABLE with the reason; a run that would
delete more than ``maxDeletePercent`` of the synced users or teams changed
nothing and answers 400 FAILED_PRECONDITION (``too_many_deletions``) unless
``force=true``; a run where some records could not be written answers 200
with ``ok: false`` and the failed IDs. All are audited and kept for
``GET .../directorySync``.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Query, Request
from pydantic import Field

from mgmt_api import fqn as fqnmod
from mgmt_api.access import CallContext
from mgmt_api.domain import rbac
from mgmt_api.errors import ApiError, Code
from mgmt_api.identity.runtime import IdentityRuntime
from mgmt_api.identity.sync.model import DirectoryTeam, DirectoryUser
from mgmt_api.identity.sync.runner import TOO_MANY_DELETIONS
from mgmt_api.routes.deps import Name, call_context
from mgmt_api.schemas.base import ApiModel, QueryBool

router = APIRouter(tags=["DirectorySync"])
Ctx = Annotated[CallContext, Depends(call_context)]
MAX_ENTRIES = 100_000


class SyncUser(ApiModel):
    """A directory user (reference ``SyncUser``); ``id`` becomes the user's name."""

    id: str = Field(min_length=1, max_length=256)
    description: str | None = Field(default=None, max_length=4096)
    email: str | None = Field(default=None, max_length=320)
    login_name: str | None = Field(default=None, max_length=256)
    display_name: str | None = Field(default=None, max_length=256)


class SyncTeam(ApiModel):
    """A directory group (reference ``SyncTeam``); members are IDs of this request."""

    id: str = Field(min_length=1, max_length=256)
    description: str | None = Field(default=None, max_length=4096)
    display_name: str | None = Field(default=None, max_length=256)
    member_user_ids: list[str] = Field(default_factory=list, max_length=MAX_ENTRIES)
    member_group_ids: list[str] = Field(default_factory=list, max_length=MAX_ENTRIES)


class SyncOrganizationRequest(ApiModel):
    """A push-style full sync (reference ``SyncOrganizationRequest``)."""

    fqn: str | None = Field(default=None, description="Optional; must be the path's organization.")
    source_type: Literal["LDAP", "AZURE"] = Field(
        description="The directory the users and teams come from; only that source's objects "
        "are touched."
    )
    users: list[SyncUser] = Field(default_factory=list, max_length=MAX_ENTRIES)
    teams: list[SyncTeam] = Field(default_factory=list, max_length=MAX_ENTRIES)


def _runtime(request: Request) -> IdentityRuntime:
    rt: IdentityRuntime = request.app.state.identity
    return rt


def _not_configured(org: str) -> ApiError:
    return ApiError(
        Code.FAILED_PRECONDITION,
        f"directory sync is not configured for organization {org!r} (list it in "
        "spec.identityProvider.sync.organizations of the install config, or push the "
        "directory with a SyncOrganization body)",
        metadata={"reason": "sync_not_configured"},
    )


def _push_source(rt: IdentityRuntime, org: str, body: SyncOrganizationRequest) -> None:
    org_fqn = fqnmod.organization_fqn(org)
    if body.fqn is not None and body.fqn.strip("/") != org_fqn:
        raise ApiError(
            Code.INVALID_ARGUMENT,
            f"fqn {body.fqn!r} is not the organization of the path ({org_fqn})",
            field="fqn",
        )
    pulled = rt.syncs.get(org)
    if pulled is not None and pulled.source.source_type == body.source_type:
        raise ApiError(
            Code.FAILED_PRECONDITION,
            f"organization {org!r} is synced from {body.source_type} by the periodic job; "
            "a pushed directory of the same source would be undone by the next run",
            field="sourceType",
            metadata={"reason": "source_is_pulled"},
        )


def _directory(body: SyncOrganizationRequest) -> tuple[list[DirectoryUser], list[DirectoryTeam]]:
    users = [
        DirectoryUser(
            id=u.id,
            login_name=u.login_name or u.id,
            email=u.email,
            display_name=u.display_name,
            description=u.description,
        )
        for u in body.users
    ]
    teams = [
        DirectoryTeam(
            id=t.id,
            display_name=t.display_name,
            description=t.description,
            member_user_ids=frozenset(t.member_user_ids),
            member_team_ids=frozenset(t.member_group_ids),
        )
        for t in body.teams
    ]
    return users, teams


@router.post("/v2/organizations/{organization}:sync", operation_id="SyncOrganization")
async def sync_organization(
    request: Request,
    ctx: Ctx,
    organization: Name,
    body: Annotated[SyncOrganizationRequest | None, Body()] = None,
    force: Annotated[QueryBool, Query()] = False,
) -> dict[str, Any]:
    """Synchronize the organization's users and teams: from the configured directory now
    (no body), or from the directory given in the body (push, a full sync).

    ``force=true`` applies a run that deletes more than ``maxDeletePercent`` of the
    synced users or teams."""
    rt = _runtime(request)
    await asyncio.to_thread(rt.authorize_sync, ctx, organization, rbac.SET_POLICY)
    if body is None:
        if organization not in rt.syncs:
            raise _not_configured(organization)
        result = await rt.sync_now(organization, force=force)
        mode = "pull"
    else:
        _push_source(rt, organization, body)
        users, teams = _directory(body)
        result = await rt.push_sync(organization, body.source_type, users, teams, force=force)
        mode = "push"
    await asyncio.to_thread(rt.audit_sync, ctx, organization, result, mode)
    if result.reason == TOO_MANY_DELETIONS:
        raise ApiError(
            Code.FAILED_PRECONDITION,
            str(result.error),
            metadata={"reason": TOO_MANY_DELETIONS, "sourceType": result.source_type},
        )
    if result.applied_nothing:
        raise ApiError(
            Code.UNAVAILABLE,
            str(result.error),
            metadata={"reason": str(result.reason), "sourceType": result.source_type},
        )
    # A plain dict: the OpenAPI documents this body as a free-form object.
    return dict(result.to_json())


@router.get("/v2/organizations/{organization}/directorySync", operation_id="GetDirectorySync")
def directory_sync_status(request: Request, ctx: Ctx, organization: Name) -> dict[str, Any]:
    """The last sync result of the organization (pulled or pushed) and its last successful one."""
    rt = _runtime(request)
    rt.authorize_sync(ctx, organization, rbac.READ)
    assert rt.runs is not None
    runs = rt.runs.get(organization)
    sync = rt.syncs.get(organization)
    if sync is None and runs["lastResult"] is None:
        raise _not_configured(organization)
    last = runs["lastResult"]
    if sync is not None:
        source_type: str | None = sync.source.source_type
    else:
        source_type = last.get("sourceType") if last else None
    return {
        "organization": organization,
        "sourceType": source_type,
        "intervalSeconds": sync.interval_s if sync is not None else None,
        **runs,
    }
