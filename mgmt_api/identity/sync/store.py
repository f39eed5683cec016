"""Where synced users and teams live: the ``DirectoryStore`` protocol.

The management plane's SQL store implements it (users and teams under
``organizations/{org}``, with ``sourceType`` set to the sync source so that
``list_*`` returns only what that source owns). Every call names the
organization and the source type. Methods are async so that an
implementation may run its blocking database work in a thread.

``InMemoryDirectoryStore`` exists for the tests of the sync logic only.
"""

from __future__ import annotations

from typing import Protocol

from mgmt_api.identity.sync.model import DirectorySnapshot, DirectoryTeam, DirectoryUser
from mgmt_api.identity.sync.reconcile import Membership


class DirectoryStore(Protocol):
    async def list_users(self, org: str, source: str) -> list[DirectoryUser]: ...

    async def list_teams(self, org: str, source: str) -> list[DirectoryTeam]:
        """Teams with their current members."""
        ...

    async def create_user(self, org: str, source: str, user: DirectoryUser) -> None: ...

    async def update_user(self, org: str, source: str, user: DirectoryUser) -> None: ...

    async def delete_user(self, org: str, source: str, user_id: str) -> None:
        """Delete the user and remove it from every team."""
        ...

    async def create_team(self, org: str, source: str, team: DirectoryTeam) -> None:
        """Create the team without members (``set_members`` follows)."""
        ...

    async def update_team(self, org: str, source: str, team: DirectoryTeam) -> None:
        """Update display name and description only."""
        ...

    async def delete_team(self, org: str, source: str, team_id: str) -> None:
        """Delete the team only, never its members."""
        ...

    async def set_members(self, org: str, source: str, team_id: str, members: Membership) -> None:
        """Make the team's members exactly ``members``."""
        ...


class InMemoryDirectoryStore:
    """A dict-backed ``DirectoryStore`` for tests; ``fail_on`` injects failures by user/team id."""

    def __init__(self) -> None:
        self.users: dict[tuple[str, str], dict[str, DirectoryUser]] = {}
        self.teams: dict[tuple[str, str], dict[str, DirectoryTeam]] = {}
        self.fail_on: set[str] = set()

    def _check(self, key: str) -> None:
        if key in self.fail_on:
            raise RuntimeError(f"injected store failure for {key}")

    def snapshot(self, org: str, source: str) -> DirectorySnapshot:
        users = tuple(sorted(self.users.get((org, source), {}).values(), key=lambda u: u.id))
        teams = tuple(sorted(self.teams.get((org, source), {}).values(), key=lambda t: t.id))
        return DirectorySnapshot(users=users, teams=teams)

    async def list_users(self, org: str, source: str) -> list[DirectoryUser]:
        return list(self.users.get((org, source), {}).values())

    async def list_teams(self, org: str, source: str) -> list[DirectoryTeam]:
        return list(self.teams.get((org, source), {}).values())

    async def create_user(self, org: str, source: str, user: DirectoryUser) -> None:
        self._check(user.id)
        users = self.users.setdefault((org, source), {})
        if user.id in users:
            raise KeyError(f"user {user.id} exists")
        users[user.id] = user

    async def update_user(self, org: str, source: str, user: DirectoryUser) -> None:
        self._check(user.id)
        self.users[(org, source)][user.id] = user

    async def delete_user(self, org: str, source: str, user_id: str) -> None:
        self._check(user_id)
        del self.users[(org, source)][user_id]
        teams = self.teams.get((org, source), {})
        for tid, team in list(teams.items()):
            if user_id in team.member_user_ids:
                teams[tid] = DirectoryTeam(
                    id=team.id,
                    display_name=team.display_name,
                    description=team.description,
                    member_user_ids=team.member_user_ids - {user_id},
                    member_team_ids=team.member_team_ids,
                )

    async def create_team(self, org: str, source: str, team: DirectoryTeam) -> None:
        self._check(team.id)
        teams = self.teams.setdefault((org, source), {})
        if team.id in teams:
            raise KeyError(f"team {team.id} exists")
        teams[team.id] = DirectoryTeam(
            id=team.id, display_name=team.display_name, description=team.description
        )

    async def update_team(self, org: str, source: str, team: DirectoryTeam) -> None:
        self._check(team.id)
        old = self.teams[(org, source)][team.id]
        self.teams[(org, source)][team.id] = DirectoryTeam(
            id=team.id,
            display_name=team.display_name,
            description=team.description,
            member_user_ids=old.member_user_ids,
            member_team_ids=old.member_team_ids,
        )

    async def delete_team(self, org: str, source: str, team_id: str) -> None:
        self._check(team_id)
        teams = self.teams[(org, source)]
        del teams[team_id]
        for tid, team in list(teams.items()):
            if team_id in team.member_team_ids:
                teams[tid] = DirectoryTeam(
                    id=team.id,
                    display_name=team.display_name,
                    description=team.description,
                    member_user_ids=team.member_user_ids,
                    member_team_ids=team.member_team_ids - {team_id},
                )

    async def set_members(self, org: str, source: str, team_id: str, members: Membership) -> None:
        self._check(f"members:{team_id}")
        team = self.teams[(org, source)][team_id]
        self.teams[(org, source)][team_id] = DirectoryTeam(
            id=team.id,
            display_name=team.display_name,
            description=team.description,
            member_user_ids=members.user_ids,
            member_team_ids=members.team_ids,
        )
