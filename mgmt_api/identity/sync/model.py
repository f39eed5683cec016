"""What a directory holds, in the shape the management plane stores.

IDs are the directory's stable identifiers (Graph object ids, or the LDAP
attribute chosen as ``userId``/``groupId``), never display names, so that a
rename is an update and not a delete plus create that would drop grants.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class DirectoryUser:
    id: str
    login_name: str
    email: str | None = None
    display_name: str | None = None
    description: str | None = None


@dataclass(frozen=True, slots=True)
class DirectoryTeam:
    """A group; members are user IDs and (nested) team IDs."""

    id: str
    display_name: str | None = None
    description: str | None = None
    member_user_ids: frozenset[str] = field(default_factory=frozenset)
    member_team_ids: frozenset[str] = field(default_factory=frozenset)

    def attributes(self) -> tuple[str | None, str | None]:
        """The fields compared for an update (members are compared separately)."""
        return (self.display_name, self.description)


@dataclass(frozen=True, slots=True)
class DirectorySnapshot:
    """Users and teams at one moment; members refer only to IDs in the snapshot."""

    users: tuple[DirectoryUser, ...] = ()
    teams: tuple[DirectoryTeam, ...] = ()

    @classmethod
    def build(
        cls, users: list[DirectoryUser], teams: list[DirectoryTeam]
    ) -> tuple[DirectorySnapshot, int]:
        """Normalize a fetched directory; returns it and the number of dropped references.

        Duplicate IDs keep the first occurrence (paging can repeat an entry
        when the directory changes mid-listing). Members that are not users
        or teams of the snapshot (devices, service principals, users outside
        ``userFilter``) are dropped, so memberships stay exact and valid.
        """
        unique_users = {u.id: u for u in reversed(users)}
        unique_teams = {t.id: t for t in reversed(teams)}
        dropped = 0
        clean: list[DirectoryTeam] = []
        for team in sorted(unique_teams.values(), key=lambda t: t.id):
            members = frozenset(m for m in team.member_user_ids if m in unique_users)
            nested = frozenset(
                m for m in team.member_team_ids if m in unique_teams and m != team.id
            )
            dropped += len(team.member_user_ids) - len(members)
            dropped += len(team.member_team_ids) - len(nested)
            clean.append(
                DirectoryTeam(
                    id=team.id,
                    display_name=team.display_name,
                    description=team.description,
                    member_user_ids=members,
                    member_team_ids=nested,
                )
            )
        ordered_users = tuple(sorted(unique_users.values(), key=lambda u: u.id))
        return cls(users=ordered_users, teams=tuple(clean)), dropped
