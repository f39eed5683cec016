"""``GET .../clusters/{cluster}/onboarding/status``.

The config's CRUD is generated from the kind registry; this router must be
mounted before those routes so ``status`` is not taken for a config name
(validation also reserves that name).
"""

from fastapi import APIRouter

from meshplane.kinds_contract import Kind
from mgmt_api.routes.deps import ClusterFqn, Ctx, Onboarding
from mgmt_api.schemas.onboarding import ClusterOnboardingStatus

router = APIRouter()


@router.get(
    "/v2/organizations/{organization}/clusters/{cluster}/onboarding/status",
    response_model=ClusterOnboardingStatus,
    response_model_exclude_none=True,
    operation_id="GetClusterOnboardingStatus",
    tags=[Kind.CLUSTER_ONBOARDING_CONFIG],
    summary="Desired and current state of each configured namespace (READ)",
)
def onboarding_status(
    ctx: Ctx, cluster: ClusterFqn, onboarding: Onboarding
) -> ClusterOnboardingStatus:
    return onboarding.status(ctx, cluster)
