"""Full-sync planning: the exact operations that make the store equal the directory.

Pure: two snapshots in, a plan out. "Full" means users and teams of this
source that are no longer in the directory are deleted, and every team's
membership becomes exactly the directory's. Users and teams of other
sources (local users, manual teams) are never in ``current``: the store
lists only what this source owns, so they are never touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mgmt_api.identity.sync.model import DirectorySnapshot, DirectoryTeam, DirectoryUser


@dataclass(frozen=True, slots=True)
class Membership:
    user_ids: frozenset[str]
    team_ids: frozenset[str]


@dataclass(frozen=True, slots=True)
class SyncPlan:
    create_users: tuple[DirectoryUser, ...] = ()
    update_users: tuple[DirectoryUser, ...] = ()
    delete_users: tuple[str, ...] = ()
    create_teams: tuple[DirectoryTeam, ...] = ()
    update_teams: tuple[DirectoryTeam, ...] = ()
    delete_teams: tuple[str, ...] = ()
    set_members: dict[str, Membership] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not any(
            (
                self.create_users,
                self.update_users,
                self.delete_users,
                self.create_teams,
                self.update_teams,
                self.delete_teams,
                self.set_members,
            )
        )


def plan_sync(desired: DirectorySnapshot, current: DirectorySnapshot) -> SyncPlan:
    """The operations to turn ``current`` into ``desired``, in a stable order.

    Membership is set for new teams and for teams whose members differ;
    teams are created without members first, so nested teams can refer to
    each other regardless of order.
    """
    want_users = {u.id: u for u in desired.users}
    have_users = {u.id: u for u in current.users}
    want_teams = {t.id: t for t in desired.teams}
    have_teams = {t.id: t for t in current.teams}

    create_users = tuple(u for uid, u in sorted(want_users.items()) if uid not in have_users)
    update_users = tuple(
        u for uid, u in sorted(want_users.items()) if uid in have_users and have_users[uid] != u
    )
    delete_users = tuple(sorted(set(have_users) - set(want_users)))

    create_teams = tuple(t for tid, t in sorted(want_teams.items()) if tid not in have_teams)
    update_teams = tuple(
        t
        for tid, t in sorted(want_teams.items())
        if tid in have_teams and have_teams[tid].attributes() != t.attributes()
    )
    delete_teams = tuple(sorted(set(have_teams) - set(want_teams)))

    set_members: dict[str, Membership] = {}
    for tid, team in sorted(want_teams.items()):
        old = have_teams.get(tid)
        if (
            old is None
            or old.member_user_ids != team.member_user_ids
            or old.member_team_ids != team.member_team_ids
        ):
            if old is None and not team.member_user_ids and not team.member_team_ids:
                continue
            set_members[tid] = Membership(team.member_user_ids, team.member_team_ids)
    return SyncPlan(
        create_users=create_users,
        update_users=update_users,
        delete_users=delete_users,
        create_teams=create_teams,
        update_teams=update_teams,
        delete_teams=delete_teams,
        set_members=set_members,
    )
