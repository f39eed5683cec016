"""Team: users and service accounts that access policies can name together."""

from __future__ import annotations

from pydantic import Field

from meshplane.kinds_contract import Kind
from mgmt_api import fqn as fqnmod
from mgmt_api.errors import invalid
from mgmt_api.kinds.base import Behaviour, KindDef, Write
from mgmt_api.kinds.user import SourceType
from mgmt_api.schemas.resources import Meta

_MEMBER_KINDS = ("User", "ServiceAccount")


class Team(Meta):
    members: list[str] | None = Field(
        default=None, description="FQNs of users and service accounts."
    )
    source_type: SourceType | None = Field(default=None, description="Output only.")


class TeamBehaviour(Behaviour):
    def validate(self, write: Write) -> None:
        for i, member in enumerate(write.spec.get("members") or []):
            field = f"{write.prefix}.members[{i}]"
            if fqnmod.parse(member, field).kind not in _MEMBER_KINDS:
                raise invalid(field, "members are user or service-account FQNs")
        write.spec.setdefault("sourceType", "MANUAL")


KIND = KindDef(Kind.TEAM, Team, behaviour=TeamBehaviour())
