"""SecurityGroup: namespaces of a workspace that share security settings.

Without its own ``namespaceSelector`` a group selects what its workspace does.
"""

from __future__ import annotations

from typing import Literal

from mgmt_api.kinds.base import Behaviour, KindDef, Write
from mgmt_api.kinds.common import validate_selector
from mgmt_api.schemas.resources import ConfigGenerationMetadata, Meta, NamespaceSelector


class SecurityGroup(Meta):
    namespace_selector: NamespaceSelector | None = None
    config_mode: Literal["BRIDGED", "DIRECT"] | None = None
    deletion_protection_enabled: bool | None = None
    config_generation_metadata: ConfigGenerationMetadata | None = None


class SecurityGroupBehaviour(Behaviour):
    def validate(self, write: Write) -> None:
        validate_selector(write.spec, write.prefix, required=False)


KIND = KindDef(
    "SecurityGroup",
    "securitygroups",
    "securitygroup",
    "securityGroup",
    "securityGroups",
    SecurityGroup,
    ("Workspace",),
    behaviour=SecurityGroupBehaviour(),
    protectable=True,
)
