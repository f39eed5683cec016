"""Full-sync planning (pure) and applying a plan with store failures (in-memory store)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from mgmt_api.identity.sync.model import DirectorySnapshot, DirectoryTeam, DirectoryUser
from mgmt_api.identity.sync.reconcile import Membership, SyncPlan, plan_sync
from mgmt_api.identity.sync.runner import (
    TOO_MANY_DELETIONS,
    DirectorySync,
    SourceError,
    run_sync,
)
from mgmt_api.identity.sync.store import InMemoryDirectoryStore

A = DirectoryUser("a", "alice", "a@x.test", "Alice")
B = DirectoryUser("b", "bob", "b@x.test", "Bob")
C = DirectoryUser("c", "carol")
A2 = DirectoryUser("a", "alice", "alice@new.test", "Alice")


def team(
    tid: str,
    users: Iterable[str] = (),
    teams: Iterable[str] = (),
    name: str | None = None,
) -> DirectoryTeam:
    return DirectoryTeam(tid, name or tid.upper(), None, frozenset(users), frozenset(teams))


def snap(users: list[DirectoryUser], teams: list[DirectoryTeam]) -> DirectorySnapshot:
    return DirectorySnapshot(tuple(users), tuple(teams))


CASES = [
    ("nothing to do", snap([A], [team("t", {"a"})]), snap([A], [team("t", {"a"})]), SyncPlan()),
    (
        "first sync",
        snap([A, B], [team("t", {"a", "b"}), team("empty")]),
        snap([], []),
        SyncPlan(
            create_users=(A, B),
            create_teams=(team("empty"), team("t", {"a", "b"})),
            set_members={"t": Membership(frozenset({"a", "b"}), frozenset())},
        ),
    ),
    (
        "user changed, user removed, member removed",
        snap([A2], [team("t", {"a"})]),
        snap([A, B], [team("t", {"a", "b"})]),
        SyncPlan(
            update_users=(A2,),
            delete_users=("b",),
            set_members={"t": Membership(frozenset({"a"}), frozenset())},
        ),
    ),
    (
        "team renamed keeps members, team deleted",
        snap([A], [team("t", {"a"}, name="New name")]),
        snap([A], [team("t", {"a"}), team("gone", {"a"})]),
        SyncPlan(update_teams=(team("t", {"a"}, name="New name"),), delete_teams=("gone",)),
    ),
    (
        "nested team membership is exact",
        snap([A, C], [team("p", {"c"}, {"q"}), team("q", {"a"})]),
        snap([A, C], [team("p", {"c", "a"}), team("q", {"a"})]),
        SyncPlan(set_members={"p": Membership(frozenset({"c"}), frozenset({"q"}))}),
    ),
]


@pytest.mark.parametrize(
    ("name", "desired", "current", "expected"), CASES, ids=[c[0] for c in CASES]
)
def test_plan(
    name: str, desired: DirectorySnapshot, current: DirectorySnapshot, expected: SyncPlan
) -> None:
    assert plan_sync(desired, current) == expected
    assert plan_sync(desired, current).empty is (expected == SyncPlan())


def test_snapshot_build_drops_dangling_members_and_duplicates() -> None:
    built, dropped = DirectorySnapshot.build(
        [A, B, DirectoryUser("a", "duplicate")],
        [team("t", {"a", "ghost"}, {"t", "nope"}), team("u")],
    )
    assert [u.login_name for u in built.users] == ["alice", "bob"]
    assert built.teams[0].member_user_ids == {"a"} and built.teams[0].member_team_ids == frozenset()
    assert dropped == 3


class ListSource:
    source_type = "LDAP"

    def __init__(self, users: list[DirectoryUser], teams: list[DirectoryTeam]) -> None:
        self.users, self.teams = users, teams
        self.fail: str | None = None

    async def fetch(self) -> tuple[list[DirectoryUser], list[DirectoryTeam]]:
        if self.fail:
            raise SourceError(self.fail)
        return list(self.users), list(self.teams)


async def test_applying_reaches_the_desired_state_and_leaves_other_sources_alone() -> None:
    store = InMemoryDirectoryStore()
    await store.create_user("org", "MANUAL", DirectoryUser("admin", "admin"))
    source = ListSource([A, B], [team("t", {"a", "b"}), team("p", set(), {"t"})])
    result = await run_sync("org", source, store)
    assert result.ok and result.memberships_set == 2
    desired, _ = DirectorySnapshot.build(source.users, source.teams)
    assert store.snapshot("org", "LDAP") == desired
    assert [u.id for u in await store.list_users("org", "MANUAL")] == ["admin"]
    source.users, source.teams = [B], []
    result = await run_sync("org", source, store, max_delete_percent=100)
    assert (result.users_deleted, result.teams_deleted) == (1, 2)
    assert store.snapshot("org", "LDAP") == snap([B], [])
    assert [u.id for u in await store.list_users("org", "MANUAL")] == ["admin"]


async def test_store_failures_are_reported_per_id_and_retried_next_run() -> None:
    store = InMemoryDirectoryStore()
    store.fail_on = {"b", "t"}
    source = ListSource([A, B], [team("t", {"a"}), team("u", {"a", "b"})])
    result = await run_sync("org", source, store)
    assert (
        not result.ok and result.error is not None and "2 store operations failed" in result.error
    )
    assert result.failed_users.addition == ["b"] and result.failed_teams.addition == ["t"]
    assert result.to_json()["failedUsers"] == {"addition": ["b"], "update": [], "removal": []}
    store.fail_on = set()
    again = await run_sync("org", source, store)
    assert again.ok and (again.users_created, again.teams_created) == (1, 1)
    desired, _ = DirectorySnapshot.build(source.users, source.teams)
    assert store.snapshot("org", "LDAP") == desired


async def test_source_failure_changes_nothing_and_is_kept_as_last_result() -> None:
    store = InMemoryDirectoryStore()
    source = ListSource([A], [team("t", {"a"})])
    sync = DirectorySync("org", source, store, interval_s=60)
    good = await sync.run_now()
    source.users, source.fail = [], "directory unreachable"
    bad = await sync.run_now()
    assert (
        not bad.ok
        and "directory unreachable" in (bad.error or "")
        and "nothing was changed" in (bad.error or "")
    )
    assert store.snapshot("org", "LDAP").users == (A,)
    assert sync.last_result is bad and sync.last_success is good
    assert bad.to_json()["ok"] is False


async def test_a_listing_that_would_delete_most_synced_users_is_refused_unless_forced() -> None:
    """An empty (or truncated) listing that reads fine must not wipe the organization."""
    store = InMemoryDirectoryStore()
    source = ListSource([A, B, C], [team("t", {"a"})])
    sync = DirectorySync("org", source, store, interval_s=60)
    assert (await sync.run_now()).ok
    source.users, source.teams = [], []
    refused = await sync.run_now()
    assert not refused.ok and refused.reason == TOO_MANY_DELETIONS and refused.applied_nothing
    assert "3 of 3 synced users" in (refused.error or "") and "force" in (refused.error or "")
    assert len(store.snapshot("org", "LDAP").users) == 3  # untouched
    assert refused.to_json()["reason"] == TOO_MANY_DELETIONS
    forced = await sync.run_now(force=True)
    assert forced.ok and forced.forced and forced.users_deleted == 3
    assert store.snapshot("org", "LDAP") == snap([], [])


@pytest.mark.parametrize(
    ("percent", "remaining", "applied"),
    [(50, [A], False), (50, [A, B], True), (0, [A, B], False), (100, [], True)],
)
async def test_the_deletion_threshold_is_a_share_of_the_synced_users(
    percent: int, remaining: list[DirectoryUser], applied: bool
) -> None:
    store = InMemoryDirectoryStore()
    source = ListSource([A, B, C], [])
    await run_sync("org", source, store)
    source.users = remaining
    result = await run_sync("org", source, store, max_delete_percent=percent)
    assert result.ok is applied
    assert len(store.snapshot("org", "LDAP").users) == (len(remaining) if applied else 3)


class CrashingSource(ListSource):
    async def fetch(self) -> tuple[list[DirectoryUser], list[DirectoryTeam]]:
        raise KeyError("value")  # a source bug, not a SourceError


async def test_an_unexpected_source_exception_is_recorded_and_changes_nothing() -> None:
    store = InMemoryDirectoryStore()
    sync = DirectorySync("org", ListSource([A], []), store, interval_s=60)
    assert (await sync.run_now()).ok
    sync.source = CrashingSource([], [])
    crashed = await sync.run_now()
    assert not crashed.ok and crashed.applied_nothing
    assert "KeyError" in (crashed.error or "") and "nothing was changed" in (crashed.error or "")
    assert sync.last_result is crashed
    assert store.snapshot("org", "LDAP").users == (A,)
