"""Team: users and service accounts that access policies can name together.

Who belongs to a team is part of every policy that names the team, so
changing ``members`` needs SET_POLICY on the team (:data:`MEMBERS`), not
just WRITE: otherwise a writer could join a team bound ``rbac/admin``.
"""

from __future__ import annotations

from pydantic import Field

from meshplane.kinds_contract import Kind
from mgmt_api import fqn as fqnmod
from mgmt_api.errors import invalid
from mgmt_api.kinds.base import AccessGrant, Behaviour, KindDef, Write, revived_by_create
from mgmt_api.kinds.user import SourceType
from mgmt_api.schemas.resources import Meta

_MEMBER_KINDS = ("User", "ServiceAccount")


class Team(Meta):
    members: list[str] | None = Field(
        default=None,
        description="FQNs of users and service accounts (changing them needs SET_POLICY).",
    )
    source_type: SourceType | None = Field(default=None, description="Output only.")


MEMBERS = AccessGrant(
    "Team",
    "members",
    "a member gets every grant of the team",
    field=("members",),
)


class TeamBehaviour(Behaviour):
    grants = (revived_by_create("Team"), MEMBERS)

    def validate(self, write: Write) -> None:
        for i, member in enumerate(write.spec.get("members") or []):
            field = f"{write.prefix}.members[{i}]"
            if fqnmod.parse(member, field).kind not in _MEMBER_KINDS:
                raise invalid(field, "members are user or service-account FQNs")
        write.spec.setdefault("sourceType", "MANUAL")


KIND = KindDef(Kind.TEAM, Team, behaviour=TeamBehaviour())
