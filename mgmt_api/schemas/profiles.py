"""The profile views: ``.../availableprofiles`` and ``.../blame``.

Here rather than in the route so :mod:`mgmt_api.service.profiles` can return them.
"""

from typing import Any

from pydantic import Field

from mgmt_api.schemas.base import ApiModel


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
