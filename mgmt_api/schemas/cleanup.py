"""The cleanup request and its result (``POST .../organizations/{organization}/cleanupresources``).

Here rather than in the route so :mod:`mgmt_api.service.cleanup` can return the result.
"""

from pydantic import Field

from mgmt_api.schemas.base import ApiModel


class CleanupResourcesRequest(ApiModel):
    apply: bool = Field(default=False, description="false: dry run, nothing changes.")


class CleanupItem(ApiModel):
    fqn: str
    kind: str
    reason: str


class CleanupResourcesResponse(ApiModel):
    apply: bool
    changes: list[CleanupItem] = Field(
        description="Deletions, and deleted principals removed from the bindings and teams "
        "still naming them: would be applied (dry run) or were applied (apply)."
    )
    skipped: list[CleanupItem] = Field(
        description=(
            "Unused but protected (itself or below), still holding objects, or (security "
            "groups) selecting clusters whose agents never reported or are stale."
        )
    )
