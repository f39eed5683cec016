"""SecurityGroup: namespaces of a workspace that share security settings.

Without its own ``namespaceSelector`` a group selects what its workspace does.
"""

from __future__ import annotations

from typing import Literal

from meshplane.kinds_contract import Kind
from mgmt_api.kinds.base import Behaviour, KindDef, Write
from mgmt_api.kinds.common import Selecting, validate_selector


class SecurityGroup(Selecting):
    config_mode: Literal["BRIDGED", "DIRECT"] | None = None


class SecurityGroupBehaviour(Behaviour):
    def validate(self, write: Write) -> None:
        validate_selector(write.spec, write.prefix, required=False)


KIND = KindDef(
    Kind.SECURITY_GROUP,
    SecurityGroup,
    behaviour=SecurityGroupBehaviour(),
    protectable=True,
)
