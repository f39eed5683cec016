"""The onboarding status view (``GET .../clusters/{cluster}/onboarding/status``).

Here rather than in the route so :mod:`mgmt_api.service.onboarding` can return it.
"""

from pydantic import Field

from mgmt_api.schemas.base import ApiModel


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
