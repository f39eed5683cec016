"""One sync run (fetch → plan → apply) and the periodic job around it.

Failure policy: if the directory cannot be read completely (network error,
throttled past the retry bound, bad credentials, a page that fails half-way)
nothing is applied, so the store keeps the last good state; the failure is
returned in the ``SyncResult`` and kept as ``last_result``. A partial listing
must never be applied: a full sync would delete everyone on the missing pages.

Individual store operations that fail are recorded by ID (the
``SyncOrganization`` response's ``failedUsers``/``failedTeams`` shape) and
the rest still applies; the next run retries them, since it plans from the
store's actual state.

Seams: ``DirectorySync.run_now()`` for ``POST /v2/organizations/{org}:sync``
(returns the result; concurrent calls share one run), ``run_forever(stop)``
as the background task started with the app, ``last_result`` for status.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from mgmt_api.identity.sync.model import DirectorySnapshot, DirectoryTeam, DirectoryUser
from mgmt_api.identity.sync.reconcile import plan_sync
from mgmt_api.identity.sync.store import DirectoryStore

log = logging.getLogger(__name__)


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

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        """The body of ``POST /v2/organizations/{org}:sync`` (camelCase)."""

        def ids(f: FailedIds) -> dict[str, list[str]]:
            return {"addition": f.addition, "update": f.update, "removal": f.removal}

        return {
            "organization": self.organization,
            "sourceType": self.source_type,
            "ok": self.ok,
            "error": self.error,
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


async def run_sync(
    org: str,
    source: DirectorySource,
    store: DirectoryStore,
    *,
    clock: Callable[[], float] = time.time,
) -> SyncResult:
    """Make the store's users and teams of ``source`` equal the directory's."""
    kind = source.source_type
    result = SyncResult(organization=org, source_type=kind, started_at=clock())
    try:
        users, teams = await source.fetch()
    except SourceError as exc:
        result.error = f"reading the directory failed, nothing was changed: {exc}"
        result.finished_at = clock()
        log.warning("directory sync of %s failed: %s", org, exc)
        return result
    desired, result.dropped_references = DirectorySnapshot.build(users, teams)
    current = DirectorySnapshot(
        users=tuple(await store.list_users(org, kind)),
        teams=tuple(await store.list_teams(org, kind)),
    )
    plan = plan_sync(desired, current)

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

    failures = len(result.failed_users) + len(result.failed_teams)
    if failures:
        result.error = f"{failures} store operations failed; they are retried on the next run"
    result.finished_at = clock()
    return result


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
    ) -> None:
        self.org = org
        self.source = source
        self.store = store
        self.interval_s = interval_s
        self._clock = clock
        self._lock = asyncio.Lock()
        self.last_result: SyncResult | None = None
        self.last_success: SyncResult | None = None

    async def run_now(self) -> SyncResult:
        """Run a sync, or wait for the one already running and return its result."""
        if self._lock.locked():
            async with self._lock:
                assert self.last_result is not None
                return self.last_result
        async with self._lock:
            result = await run_sync(self.org, self.source, self.store, clock=self._clock)
            self.last_result = result
            if result.ok:
                self.last_success = result
            return result

    async def run_forever(self, stop: asyncio.Event) -> None:
        """Sync now and then every ``interval_s`` until ``stop`` is set."""
        while not stop.is_set():
            try:
                await self.run_now()
            except Exception:  # the loop must survive a store outage
                log.exception("directory sync of %s crashed", self.org)
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.interval_s)
            except TimeoutError:
                continue
