"""``GET .../clusters/{cluster}/onboarding/status``.

The config's CRUD is generated from the kind registry; this router must be
mounted before those routes so ``status`` is not taken for a config name
(validation also reserves that name).
"""

from typing import Any

from fastapi import APIRouter
from pydantic import Field

from meshplane.kinds_contract import Kind
from mgmt_api.routes.deps import ClusterFqn, Ctx, Onboarding
from mgmt_api.schemas.base import ApiModel

router = APIRouter()


class NamespaceStatus(ApiModel):
    name: str
    desired_state: str = Field(description="DESIRED_ONBOARDED or DESIRED_OFFBOARDED")
    current_state: str = Field(
        description=(
            "From the agent's reports: PENDING, ONBOARDED, OFFBOARDED, FAILED or "
            "NOT_FOUND_IN_CLUSTER (see docs/api.md)"
        )
    )
    message: str | None = Field(
        default=None, description="Why the namespace is not in its desired state yet."
    )
    last_transition_time: str | None = Field(default=None, description="RFC 3339")


class ClusterOnboardingStatus(ApiModel):
    fqn: str | None = Field(default=None, description="The config; absent when none exists.")
    cluster: str
    tenant: str = Field(description="The onboarding tenant.")
    workspace: str = Field(description="The onboarding workspace.")
    last_sync_time: str | None = Field(default=None, description="The agent's last report.")
    stale: bool | None = Field(default=None, description="The agent has gone silent.")
    namespaces: list[NamespaceStatus]


@router.get(
    "/v2/organizations/{organization}/clusters/{cluster}/onboarding/status",
    response_model=ClusterOnboardingStatus,
    response_model_exclude_none=True,
    operation_id="GetClusterOnboardingStatus",
    tags=[Kind.CLUSTER_ONBOARDING_CONFIG],
    summary="Desired and current state of each configured namespace (READ)",
)
def onboarding_status(ctx: Ctx, cluster: ClusterFqn, onboarding: Onboarding) -> dict[str, Any]:
    return onboarding.status(ctx, cluster)
