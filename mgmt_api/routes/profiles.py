"""``.../availableprofiles`` and ``.../blame`` (docs/api.md, "Profiles and blame").

The spec names ``availableprofiles`` on organizations and ``blame`` on
organizations and clusters; both are also served on tenants and workspaces,
where profiles are attached too (docs/api.md, "Profiles and blame").
"""

from typing import Annotated

from fastapi import APIRouter, Depends

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
from mgmt_api.schemas.profiles import BlameResponse, ListAvailableProfilesResponse

router = APIRouter()


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

    def blame(ctx: Ctx, fqn: Target, profiles: Profiles) -> BlameResponse:
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

    def available_profiles(
        ctx: Ctx, fqn: Target, profiles: Profiles
    ) -> ListAvailableProfilesResponse:
        return ListAvailableProfilesResponse(profiles=profiles.available(ctx, fqn))

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
