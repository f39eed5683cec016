"""One sync run (fetch → plan → apply) and the periodic job around it.

Failure policy: if the directory cannot be read completely (network error,
throttled past the retry bound, bad credentials, a page that fails half-way)
nothing is applied, so the store keeps the last good state; the failure is
returned in the ``SyncResult`` and kept as ``last_result``. A partial listing
must never be applied: a full sync would delete everyone on the missing pages.

Any exception while reading (not only ``SourceError``: a bug in a source,
an unexpected answer shape) is caught and recorded the same way, so the run
log shows it instead of a crashed job that leaves no trace.

Deletion guard: a listing that reads fine but is empty or truncated (a
wrong ``userBase``, a filter typo, a directory outage answered with an empty
page) would delete every synced user. A run whose plan deletes more than
``max_delete_percent`` of the synced users, or of the synced teams, is
refused and applies nothing unless it is forced (``force=True``, from
``POST ...:sync?force=true``); the refusal is the run's result.

Individual store operations that fail are recorded by ID (the
``SyncOrganization`` response's ``failedUsers``/``failedTeams`` shape) and
the rest still applies; the next run retries them, since it plans from the
store's actual state.

Seams: ``DirectorySync.run_now()`` for ``POST /v2/organizations/{org}:sync``
and the periodic job (``IdentityRuntime``); concurrent calls share one run;
``last_result`` for status. ``StaticSource`` is the directory of a push-style
``SyncOrganization`` request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, TypedDict

from mgmt_api.identity.config import DEFAULT_MAX_DELETE_PERCENT
from mgmt_api.identity.sync.model import DirectorySnapshot, DirectoryTeam, DirectoryUser
from mgmt_api.identity.sync.reconcile import SyncPlan, plan_sync
from mgmt_api.identity.sync.store import DirectoryStore

log = logging.getLogger(__name__)

# ``SyncResult.reason`` values.
DIRECTORY_UNAVAILABLE = "directory_unavailable"
STORE_UNAVAILABLE = "store_unavailable"
TOO_MANY_DELETIONS = "too_many_deletions"
STORE_FAILURES = "store_failures"


class SourceError(Exception):
    """The directory could not be read; the message is safe to log and return."""


class DirectorySource(Protocol):
    @property
    def source_type(self) -> str:
        """``AZURE`` or ``LDAP``."""
        ...

    async def fetch(self) -> tuple[list[DirectoryUser], list[DirectoryTeam]]:
        """Everything in the directory, or ``SourceError``."""
        ...


@dataclass(slots=True)
class FailedIds:
    addition: list[str] = field(default_factory=list)
    update: list[str] = field(default_factory=list)
    removal: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.addition) + len(self.update) + len(self.removal)


class FailedIdsJson(TypedDict):
    addition: list[str]
    update: list[str]
    removal: list[str]


class UserCountsJson(TypedDict):
    created: int
    updated: int
    deleted: int


class TeamCountsJson(UserCountsJson):
    membershipsSet: int


class SyncResultJson(TypedDict):
    """A run as ``POST /v2/organizations/{org}:sync`` answers it and the run log keeps it."""

    organization: str
    sourceType: str
    ok: bool
    error: str | None
    reason: str | None
    forced: bool
    startedAt: float
    finishedAt: float
    users: UserCountsJson
    teams: TeamCountsJson
    droppedReferences: int
    failedUsers: FailedIdsJson
    failedTeams: FailedIdsJson


@dataclass(slots=True)
class SyncResult:
    organization: str
    source_type: str
    started_at: float
    finished_at: float = 0.0
    error: str | None = None
    users_created: int = 0
    users_updated: int = 0
    users_deleted: int = 0
    teams_created: int = 0
    teams_updated: int = 0
    teams_deleted: int = 0
    memberships_set: int = 0
    dropped_references: int = 0
    failed_users: FailedIds = field(default_factory=FailedIds)
    failed_teams: FailedIds = field(default_factory=FailedIds)
    reason: str | None = None
    """Why the run is not ok: ``directory_unavailable``, ``store_unavailable``,
    ``too_many_deletions`` (nothing was applied) or ``store_failures`` (some was)."""
    forced: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def applied_nothing(self) -> bool:
        """The run failed before writing anything (the last good state is untouched)."""
        return self.reason in {DIRECTORY_UNAVAILABLE, STORE_UNAVAILABLE, TOO_MANY_DELETIONS}

    def to_json(self) -> SyncResultJson:
        """The body of ``POST /v2/organizations/{org}:sync`` (camelCase)."""

        def ids(f: FailedIds) -> FailedIdsJson:
            return {"addition": f.addition, "update": f.update, "removal": f.removal}

        return {
            "organization": self.organization,
            "sourceType": self.source_type,
            "ok": self.ok,
            "error": self.error,
            "reason": self.reason,
            "forced": self.forced,
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
            "users": {
                "created": self.users_created,
                "updated": self.users_updated,
                "deleted": self.users_deleted,
            },
            "teams": {
                "created": self.teams_created,
                "updated": self.teams_updated,
                "deleted": self.teams_deleted,
                "membershipsSet": self.memberships_set,
            },
            "droppedReferences": self.dropped_references,
            "failedUsers": ids(self.failed_users),
            "failedTeams": ids(self.failed_teams),
        }


def deletion_refusal(
    plan: SyncPlan, current: DirectorySnapshot, max_delete_percent: int
) -> str | None:
    """Why ``plan`` deletes too much of ``current``, or ``None`` when it may apply."""
    problems = []
    for what, deleted, total in (
        ("users", len(plan.delete_users), len(current.users)),
        ("teams", len(plan.delete_teams), len(current.teams)),
    ):
        if total and deleted * 100 > max_delete_percent * total:
            problems.append(f"{deleted} of {total} synced {what}")
    if not problems:
        return None
    return (
        f"the directory listing would delete {' and '.join(problems)}, more than "
        f"maxDeletePercent ({max_delete_percent}%); nothing was changed. If the directory "
        "really lost them, run the sync with force=true"
    )


async def run_sync(
    org: str,
    source: DirectorySource,
    store: DirectoryStore,
    *,
    clock: Callable[[], float] = time.time,
    max_delete_percent: int = DEFAULT_MAX_DELETE_PERCENT,
    force: bool = False,
) -> SyncResult:
    """Make the store's users and teams of ``source`` equal the directory's."""
    kind = source.source_type
    result = SyncResult(organization=org, source_type=kind, started_at=clock(), forced=force)
    try:
        desired, current = await _snapshots(org, source, store, result)
        plan = plan_sync(desired, current)
        refusal = None if force else deletion_refusal(plan, current, max_delete_percent)
        if refusal is not None:
            log.warning("directory sync of %s refused: %s", org, refusal)
            raise _Stopped(TOO_MANY_DELETIONS, refusal)
    except _Stopped as stopped:
        result.reason, result.error = stopped.reason, stopped.error
        result.finished_at = clock()
        return result
    await _apply(plan, org, kind, store, result)
    failures = len(result.failed_users) + len(result.failed_teams)
    if failures:
        result.reason = STORE_FAILURES
        result.error = f"{failures} store operations failed; they are retried on the next run"
    result.finished_at = clock()
    return result


class _Stopped(Exception):
    """A sync that changes nothing: the reason code and the message for the result."""

    def __init__(self, reason: str, error: str) -> None:
        super().__init__(error)
        self.reason, self.error = reason, error


async def _snapshots(
    org: str, source: DirectorySource, store: DirectoryStore, result: SyncResult
) -> tuple[DirectorySnapshot, DirectorySnapshot]:
    """The directory's users and teams (desired) and the store's (current); _Stopped
    when either cannot be read, so nothing is changed."""
    kind = source.source_type
    try:
        users, teams = await source.fetch()
    except SourceError as exc:
        log.warning("directory sync of %s failed: %s", org, exc)
        raise _Stopped(
            DIRECTORY_UNAVAILABLE, f"reading the directory failed, nothing was changed: {exc}"
        ) from None
    except Exception as exc:  # a source bug must be reported, not crash the job silently
        log.exception("directory sync of %s: reading the directory crashed", org)
        raise _Stopped(
            DIRECTORY_UNAVAILABLE,
            f"reading the directory failed unexpectedly ({exc.__class__.__name__}), nothing "
            "was changed; see the management plane's log",
        ) from None
    desired, result.dropped_references = DirectorySnapshot.build(users, teams)
    try:
        current = DirectorySnapshot(
            users=tuple(await store.list_users(org, kind)),
            teams=tuple(await store.list_teams(org, kind)),
        )
    except Exception as exc:
        log.exception("directory sync of %s: reading the current users and teams failed", org)
        raise _Stopped(
            STORE_UNAVAILABLE,
            f"reading the current users and teams failed ({exc.__class__.__name__}), nothing "
            "was changed",
        ) from None
    return desired, current


async def _apply(
    plan: SyncPlan, org: str, kind: str, store: DirectoryStore, result: SyncResult
) -> None:
    """Carry out ``plan`` one record at a time, counting successes and failures in ``result``."""

    async def attempt(op: Awaitable[None], failed: list[str], key: str) -> bool:
        try:
            await op
        except Exception as exc:  # one bad record must not stop the others
            log.warning("directory sync of %s: %s failed: %s", org, key, exc.__class__.__name__)
            failed.append(key)
            return False
        return True

    users_failed, teams_failed = result.failed_users, result.failed_teams
    for user in plan.create_users:
        if await attempt(store.create_user(org, kind, user), users_failed.addition, user.id):
            result.users_created += 1
    for user in plan.update_users:
        if await attempt(store.update_user(org, kind, user), users_failed.update, user.id):
            result.users_updated += 1
    for team in plan.create_teams:
        if await attempt(store.create_team(org, kind, team), teams_failed.addition, team.id):
            result.teams_created += 1
    for team in plan.update_teams:
        if await attempt(store.update_team(org, kind, team), teams_failed.update, team.id):
            result.teams_updated += 1
    for team_id, members in plan.set_members.items():
        if team_id in teams_failed.addition:
            continue  # the team does not exist; the next run creates it
        set_op = store.set_members(org, kind, team_id, members)
        if await attempt(set_op, teams_failed.update, team_id):
            result.memberships_set += 1
    for team_id in plan.delete_teams:
        if await attempt(store.delete_team(org, kind, team_id), teams_failed.removal, team_id):
            result.teams_deleted += 1
    for user_id in plan.delete_users:
        if await attempt(store.delete_user(org, kind, user_id), users_failed.removal, user_id):
            result.users_deleted += 1


class StaticSource:
    """A directory handed over whole: the body of a push-style ``SyncOrganization``.

    Providers without a pull source (neither Graph nor LDAP) push their users
    and teams; the same reconcile applies them as a full sync.
    """

    def __init__(
        self, source_type: str, users: list[DirectoryUser], teams: list[DirectoryTeam]
    ) -> None:
        self.source_type = source_type
        self._users = users
        self._teams = teams

    async def fetch(self) -> tuple[list[DirectoryUser], list[DirectoryTeam]]:
        return list(self._users), list(self._teams)


class DirectorySync:
    """The sync of one organization from one source: on demand and periodic."""

    def __init__(
        self,
        org: str,
        source: DirectorySource,
        store: DirectoryStore,
        *,
        interval_s: float,
        clock: Callable[[], float] = time.time,
        max_delete_percent: int = DEFAULT_MAX_DELETE_PERCENT,
    ) -> None:
        self.org = org
        self.source = source
        self.store = store
        self.interval_s = interval_s
        self.max_delete_percent = max_delete_percent
        self._clock = clock
        self._lock = asyncio.Lock()
        self.last_result: SyncResult | None = None
        self.last_success: SyncResult | None = None

    async def run_now(self, *, force: bool = False) -> SyncResult:
        """Run a sync, or wait for the one already running and return its result.

        A forced run never joins another: it waits for it, then runs itself,
        so ``force`` is never lost to a concurrent unforced run.
        """
        if self._lock.locked() and not force:
            async with self._lock:
                assert self.last_result is not None
                return self.last_result
        async with self._lock:
            result = await run_sync(
                self.org,
                self.source,
                self.store,
                clock=self._clock,
                max_delete_percent=self.max_delete_percent,
                force=force,
            )
            self.last_result = result
            if result.ok:
                self.last_success = result
            return result
