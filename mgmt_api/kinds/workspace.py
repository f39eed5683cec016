"""Workspace: the namespaces (``cluster/namespace`` patterns) a tenant manages."""

from __future__ import annotations

from mgmt_api.kinds.base import KindDef, Write
from mgmt_api.kinds.common import ProfiledBehaviour, validate_selector
from mgmt_api.schemas.resources import ConfigGenerationMetadata, Meta, NamespaceSelector


class Workspace(Meta):
    namespace_selector: NamespaceSelector | None = None
    privileged: bool | None = None
    deletion_protection_enabled: bool | None = None
    security_domain: str | None = None
    profiles: list[str] | None = None
    config_generation_metadata: ConfigGenerationMetadata | None = None


class WorkspaceBehaviour(ProfiledBehaviour):
    def validate(self, write: Write) -> None:
        super().validate(write)
        validate_selector(write.spec, write.prefix, required=True)


KIND = KindDef(
    "Workspace",
    "workspaces",
    "workspace",
    "workspace",
    "workspaces",
    Workspace,
    ("Tenant",),
    behaviour=WorkspaceBehaviour(),
    protectable=True,
)
