"""Workspace: the namespaces (``cluster/namespace`` patterns) a tenant manages."""

from __future__ import annotations

from meshplane.kinds_contract import Kind
from mgmt_api.kinds.base import KindDef, Write
from mgmt_api.kinds.common import ProfiledBehaviour, Selecting, validate_selector
from mgmt_api.schemas.resources import NamespaceSelector


class Workspace(Selecting):
    namespace_selector: NamespaceSelector  # required here (a security group's is optional)
    privileged: bool | None = None
    security_domain: str | None = None
    profiles: list[str] | None = None


class WorkspaceBehaviour(ProfiledBehaviour):
    def validate(self, write: Write) -> None:
        super().validate(write)
        validate_selector(write.spec, write.prefix, required=True)


KIND = KindDef(Kind.WORKSPACE, Workspace, behaviour=WorkspaceBehaviour(), protectable=True)
