"""``.../availableprofiles`` and ``.../blame`` (docs/api.md, "Profiles and blame").

The spec names ``availableprofiles`` on organizations and ``blame`` on
organizations and clusters; both are also served on tenants and workspaces,
where profiles are attached too (docs/api.md, "Profiles and blame").
"""

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import Field

from meshplane.kinds_contract import Kind
from mgmt_api.routes.deps import (
    Ctx,
    FqnOf,
    Profiles,
    cluster_fqn,
    organization_fqn,
    tenant_fqn,
    workspace_fqn,
)
from mgmt_api.schemas.base import ApiModel

router = APIRouter()


class AvailableProfile(ApiModel):
    fqn: str
    display_name: str
    description: str
    level: str = Field(description="ORGANIZATION, TENANT or WORKSPACE: where it was created.")


class ListAvailableProfilesResponse(ApiModel):
    profiles: list[AvailableProfile]


class BlameSource(ApiModel):
    fqn: str = Field(description="The profile or the object that set the value.")
    kind: str = Field(description="PROFILE or RESOURCE.")
    section: str = Field(description="DEFAULTS, MANDATES (profiles) or OWN (the object).")


class Shadowed(ApiModel):
    value: Any
    source: BlameSource


class BlameEntry(ApiModel):
    path: str = Field(description="Dot-joined setting path.")
    value: Any
    source: BlameSource
    shadowed: list[Shadowed] = Field(description="Values that lost to this one, oldest first.")


class BlameResponse(ApiModel):
    fqn: str
    profiles: list[str] = Field(description="The profiles applied, in order.")
    missing_profiles: list[str] = Field(description="Attached profiles that no longer exist.")
    entries: list[BlameEntry]


LEVELS: list[tuple[str, FqnOf, str]] = [
    ("/v2/organizations/{organization}", organization_fqn, Kind.ORGANIZATION),
    ("/v2/organizations/{organization}/tenants/{tenant}", tenant_fqn, Kind.TENANT),
    (
        "/v2/organizations/{organization}/tenants/{tenant}/workspaces/{workspace}",
        workspace_fqn,
        Kind.WORKSPACE,
    ),
]
CLUSTER = ("/v2/organizations/{organization}/clusters/{cluster}", cluster_fqn, Kind.CLUSTER)


def _add(prefix: str, fqn_of: FqnOf, kind: str, *, available: bool) -> None:
    Target = Annotated[str, Depends(fqn_of)]

    def blame(ctx: Ctx, fqn: Target, profiles: Profiles) -> dict[str, Any]:
        return profiles.blame(ctx, fqn)

    router.add_api_route(
        f"{prefix}/blame",
        blame,
        methods=["GET"],
        response_model=BlameResponse,
        operation_id=f"Blame{kind}",
        tags=["Profiles"],
        summary=f"Effective settings of the {kind.lower()}, each with who set it (READ)",
    )
    if not available:
        return

    def available_profiles(ctx: Ctx, fqn: Target, profiles: Profiles) -> dict[str, Any]:
        return {"profiles": profiles.available(ctx, fqn)}

    router.add_api_route(
        f"{prefix}/availableprofiles",
        available_profiles,
        methods=["GET"],
        response_model=ListAvailableProfilesResponse,
        operation_id=f"ListAvailableProfiles{kind}",
        tags=["Profiles"],
        summary=f"Profiles usable on the {kind.lower()}: its own and its parents' (READ)",
    )


for _prefix, _fqn_of, _kind in LEVELS:
    _add(_prefix, _fqn_of, _kind, available=True)
_add(*CLUSTER, available=False)
