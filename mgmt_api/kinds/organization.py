"""Organization: the root of a tenant's configuration."""

from __future__ import annotations

from pydantic import Field

from meshplane.kinds_contract import Kind
from mgmt_api import fqn as fqnmod
from mgmt_api.kinds.base import KindDef, Write
from mgmt_api.kinds.common import ProfiledBehaviour
from mgmt_api.schemas.resources import ConfigGenerationMetadata, Meta


class Organization(Meta):
    deletion_protection_enabled: bool | None = None
    profiles: list[str] | None = None
    system_namespaces: list[str] | None = Field(
        default=None,
        description="Namespaces treated as system namespaces: never onboarded, no sidecars.",
    )
    config_generation_metadata: ConfigGenerationMetadata | None = None


class OrganizationBehaviour(ProfiledBehaviour):
    def validate(self, write: Write) -> None:
        super().validate(write)
        for i, ns in enumerate(write.spec.get("systemNamespaces") or []):
            fqnmod.validate_name(ns, f"{write.prefix}.systemNamespaces[{i}]")


KIND = KindDef(
    Kind.ORGANIZATION,
    Organization,
    behaviour=OrganizationBehaviour(),
    protectable=True,
)
