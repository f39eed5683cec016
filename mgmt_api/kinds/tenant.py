"""Tenant: a team's slice of an organization, holding workspaces."""

from __future__ import annotations

from meshplane.kinds_contract import Kind
from mgmt_api.kinds.base import KindDef
from mgmt_api.kinds.common import ProfiledBehaviour
from mgmt_api.schemas.resources import ConfigGenerationMetadata, Meta


class Tenant(Meta):
    deletion_protection_enabled: bool | None = None
    security_domain: str | None = None
    profiles: list[str] | None = None
    config_generation_metadata: ConfigGenerationMetadata | None = None


KIND = KindDef(Kind.TENANT, Tenant, behaviour=ProfiledBehaviour(), protectable=True)
