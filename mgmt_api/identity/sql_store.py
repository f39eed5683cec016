"""SQL-backed identity stores: pending logins and the directory users and teams.

Both live in the management plane's own database, so a login started on one
replica can finish on another, and a restart loses nothing.

* ``SqlLoginStateStore``: ``take`` is one ``DELETE ... RETURNING`` statement,
  so two racing callbacks with the same ``state`` cannot both win. ``put``
  is capped (``max_pending`` live rows): logins are started without
  credentials, so the table must not grow at an anonymous client's will.
* ``SqlLoginCodeStore``: the one-time codes of loopback logins, the same way.
* ``UsedTokenCache``: provider tokens already traded for a platform token.
* ``SqlDirectoryStore``: the ``DirectoryStore`` the sync writes through.
  Synced users and teams are ordinary ``User``/``Team`` resources under
  ``organizations/{org}`` with ``sourceType`` set to the source (``LDAP`` or
  ``AZURE``); the sync sees and touches only those, never local users or
  manual teams. Every write goes through the kinds' hooks and the delete
  rule (:mod:`mgmt_api.kinds.principals`) as a client's does, bumps the
  store revision (so cached principals and etags follow) and is audited
  with the actor ``SYNC_ACTOR``.
  Direct members are the team's ``members`` (user FQNs, as for any team);
  nested groups are kept in the team's server-owned ``status.memberTeams``
  (team FQNs), which authentication follows when it resolves a principal's
  teams.
* ``SyncRunLog``: the last result (and last success) of each organization's
  sync, so a failure is reported even by a replica that did not run it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, TypedDict, cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from meshplane.kinds_contract import Kind
from mgmt_api import fqn as fqnmod
from mgmt_api.identity.login_code import LoginCode
from mgmt_api.identity.login_state import (
    MAX_PENDING_LOGINS,
    LoginState,
    TooManyPendingLoginsError,
)
from mgmt_api.identity.sync.model import DirectoryTeam, DirectoryUser
from mgmt_api.identity.sync.reconcile import Membership
from mgmt_api.identity.sync.runner import SyncResultJson
from mgmt_api.identity.user_mapping import LoginScope, match_kind
from mgmt_api.kinds.base import KindSettings, WriteEnv
from mgmt_api.kinds.team import Team
from mgmt_api.kinds.user import SourceType, User
from mgmt_api.service import resources
from mgmt_api.store import repo
from mgmt_api.store.tables import (
    directory_sync_runs,
    login_states,
    oidc_login_codes,
    oidc_used_tokens,
)
from mgmt_api.store.uow import UnitOfWork

SYNC_ACTOR = "system:directory-sync"
USER_KIND = Kind.USER
_PAGE = 500


# ---- pending logins ----------------------------------------------------------------------


class SqlLoginStateStore:
    """A ``LoginStateStore`` in the ``login_states`` table.

    The calls are single short statements; they run on the event loop's
    thread (the protocol is synchronous), which is cheap next to the
    provider round trips of the same requests.
    """

    def __init__(self, uow: UnitOfWork, max_pending: int = MAX_PENDING_LOGINS) -> None:
        self._uow = uow
        self._max = max_pending

    def put(self, login: LoginState) -> None:
        """Insert, unless ``max_pending`` logins are pending: then expired rows are purged
        first, and if the table is still full the login is refused.

        The count and the insert share one write transaction (``BEGIN IMMEDIATE``
        on SQLite), so concurrent starts cannot overshoot the cap by much; on
        PostgreSQL replicas may overshoot it by their concurrency, which is
        harmless: the cap is a bound, not a quota.
        """
        payload = asdict(login)
        del payload["state"]
        with self._uow.write_rows() as conn:
            if self._pending(conn) >= self._max:
                conn.execute(
                    sa.delete(login_states).where(login_states.c.expires_at <= login.created_at)
                )
                if self._pending(conn) >= self._max:
                    raise TooManyPendingLoginsError()
            conn.execute(
                sa.insert(login_states).values(
                    state=login.state, payload=json.dumps(payload), expires_at=login.expires_at
                )
            )

    @staticmethod
    def _pending(conn: Connection) -> int:
        return int(conn.execute(sa.select(sa.func.count()).select_from(login_states)).scalar_one())

    def take(self, state: str, now: float) -> LoginState | None:
        with self._uow.write_rows() as conn:
            row = conn.execute(
                sa.delete(login_states)
                .where(login_states.c.state == state)
                .returning(login_states.c.payload, login_states.c.expires_at)
            ).first()
        if row is None or float(row.expires_at) <= now:
            return None  # an expired row is consumed too: it can never be used
        try:
            return LoginState(state=state, **json.loads(row.payload))
        except TypeError:  # a login started by an older version (no cookie digest)
            return None

    def __len__(self) -> int:
        with self._uow.read() as conn:
            return self._pending(conn)

    def purge_expired(self, now: float) -> int:
        with self._uow.write_rows() as conn:
            result = conn.execute(sa.delete(login_states).where(login_states.c.expires_at <= now))
        return int(result.rowcount)


class SqlLoginCodeStore:
    """A ``LoginCodeStore`` in the ``oidc_login_codes`` table (keyed by the code's digest)."""

    def __init__(self, uow: UnitOfWork) -> None:
        self._uow = uow

    def put(self, code: LoginCode) -> None:
        payload = asdict(code)
        del payload["code_hash"]
        with self._uow.write_rows() as conn:
            conn.execute(
                sa.insert(oidc_login_codes).values(
                    code_hash=code.code_hash,
                    payload=json.dumps(payload),
                    expires_at=code.expires_at,
                )
            )

    def take(self, code_hash: str) -> LoginCode | None:
        with self._uow.write_rows() as conn:
            row = conn.execute(
                sa.delete(oidc_login_codes)
                .where(oidc_login_codes.c.code_hash == code_hash)
                .returning(oidc_login_codes.c.payload)
            ).first()
        if row is None:
            return None
        return LoginCode(code_hash=code_hash, **json.loads(row.payload))

    def purge_expired(self, now: float) -> int:
        with self._uow.write_rows() as conn:
            result = conn.execute(
                sa.delete(oidc_login_codes).where(oidc_login_codes.c.expires_at <= now)
            )
        return int(result.rowcount)


class UsedTokenCache:
    """Provider tokens already traded for a platform token, until they expire.

    ``use`` is one ``INSERT`` on a primary key, so of two replicas racing with
    the same token exactly one wins. Keys are hashed: the table holds no
    token identifiers an observer could correlate.
    """

    def __init__(self, uow: UnitOfWork) -> None:
        self._uow = uow

    def use(self, token_id: str, expires_at: float) -> bool:
        """Record ``token_id``; ``False`` when it was recorded before (a replay)."""
        key = hashlib.sha256(token_id.encode()).hexdigest()
        try:
            with self._uow.write_rows() as conn:
                conn.execute(
                    sa.insert(oidc_used_tokens).values(token_key=key, expires_at=expires_at)
                )
        except sa.exc.IntegrityError:
            return False
        return True

    def purge_expired(self, now: float) -> int:
        with self._uow.write_rows() as conn:
            result = conn.execute(
                sa.delete(oidc_used_tokens).where(oidc_used_tokens.c.expires_at <= now)
            )
        return int(result.rowcount)


# ---- directory users and teams -------------------------------------------------------------


def _user_fields(user: DirectoryUser, source: str) -> User:
    """The fields the directory owns of a user (None: left out); the model checks ``source``."""
    return User(
        login_name=user.login_name,
        email=user.email,
        display_name=user.display_name[:256] if user.display_name else None,
        description=user.description[:4096] if user.description else None,
        source_type=cast(SourceType, source),
    )


def _team_fields(team: DirectoryTeam, source: str, members: list[str]) -> Team:
    """The fields the directory owns of a team (None: left out); the model checks ``source``."""
    return Team(
        display_name=team.display_name[:256] if team.display_name else None,
        description=team.description[:4096] if team.description else None,
        members=members,
        source_type=cast(SourceType, source),
    )


def _children(conn: Connection, parent: str, kind: str) -> list[repo.Resource]:
    out: list[repo.Resource] = []
    after = ""
    while True:
        page = repo.list_children(conn, parent, kind, after, _PAGE)
        out.extend(page)
        if len(page) < _PAGE:
            return out
        after = page[-1].fqn


class SqlDirectoryStore:
    """``DirectoryStore`` over the resources table (see the module docstring)."""

    def __init__(self, uow: UnitOfWork, settings: KindSettings | None = None) -> None:
        self._uow = uow
        self._settings = settings or KindSettings()
        self._principal = resources.system_principal(SYNC_ACTOR)

    # -- reads

    async def list_users(self, org: str, source: str) -> list[DirectoryUser]:
        return await asyncio.to_thread(self._list_users, org, source)

    def _list_users(self, org: str, source: str) -> list[DirectoryUser]:
        with self._uow.read() as conn:
            users = _children(conn, fqnmod.organization_fqn(org), Kind.USER)
        return [
            DirectoryUser(
                id=u.name,
                login_name=str(u.spec.get("loginName") or u.name),
                email=u.spec.get("email"),
                display_name=u.spec.get("displayName"),
                description=u.spec.get("description"),
            )
            for u in users
            if u.spec.get("sourceType") == source
        ]

    async def list_teams(self, org: str, source: str) -> list[DirectoryTeam]:
        return await asyncio.to_thread(self._list_teams, org, source)

    def _list_teams(self, org: str, source: str) -> list[DirectoryTeam]:
        with self._uow.read() as conn:
            teams = _children(conn, fqnmod.organization_fqn(org), Kind.TEAM)
        return [
            DirectoryTeam(
                id=t.name,
                display_name=t.spec.get("displayName"),
                description=t.spec.get("description"),
                member_user_ids=frozenset(
                    m.rsplit("/", 1)[1] for m in t.spec.get("members") or [] if "/users/" in m
                ),
                member_team_ids=frozenset(
                    m.rsplit("/", 1)[1] for m in t.status.get("memberTeams") or []
                ),
            )
            for t in teams
            if t.spec.get("sourceType") == source
        ]

    # -- writes: one transaction each, so one failure never undoes the others. Each goes
    # through the kinds' hooks and the delete rule, as a client's write does
    # (mgmt_api.service.resources.system_*), as the sync's own principal.

    def _write(self, fn: Callable[[WriteEnv], object]) -> None:
        with self._uow.write(SYNC_ACTOR) as tx:
            fn(WriteEnv(tx, self._principal, "", self._settings))

    async def _run(self, fn: Callable[[WriteEnv], object]) -> None:
        await asyncio.to_thread(self._write, fn)

    @staticmethod
    def _owned(conn: Connection, fqn: str, source: str) -> repo.Resource:
        res = repo.get(conn, fqn)
        if res is None or res.spec.get("sourceType") != source:
            raise LookupError(f"{fqn} is not a {source} object")
        return res

    async def create_user(self, org: str, source: str, user: DirectoryUser) -> None:
        fqn = f"{fqnmod.organization_fqn(org)}/users/{user.id}"
        fields = _user_fields(user, source)
        await self._run(
            lambda env: resources.system_create(env, Kind.USER, fqn, fields, why=_why(source))
        )

    async def update_user(self, org: str, source: str, user: DirectoryUser) -> None:
        fqn = f"{fqnmod.organization_fqn(org)}/users/{user.id}"

        def op(env: WriteEnv) -> None:
            res = self._owned(env.tx.conn, fqn, source)
            resources.system_update(env, res, _user_fields(user, source), why=_why(source))

        await self._run(op)

    async def delete_user(self, org: str, source: str, user_id: str) -> None:
        await self._delete(f"{fqnmod.organization_fqn(org)}/users/{user_id}", source)

    async def _delete(self, fqn: str, source: str) -> None:
        """Delete a synced user or team; the delete rule takes it out of every team and
        binding (a later object of the same name must not inherit them)."""

        def op(env: WriteEnv) -> None:
            self._owned(env.tx.conn, fqn, source)
            resources.system_delete(env, fqn, why=f": gone from the {source} directory")

        await self._run(op)

    async def create_team(self, org: str, source: str, team: DirectoryTeam) -> None:
        fqn = f"{fqnmod.organization_fqn(org)}/teams/{team.id}"
        fields = _team_fields(team, source, [])
        await self._run(
            lambda env: resources.system_create(env, Kind.TEAM, fqn, fields, why=_why(source))
        )

    async def update_team(self, org: str, source: str, team: DirectoryTeam) -> None:
        fqn = f"{fqnmod.organization_fqn(org)}/teams/{team.id}"

        def op(env: WriteEnv) -> None:
            res = self._owned(env.tx.conn, fqn, source)
            members = list(res.spec.get("members") or [])
            fields = _team_fields(team, source, members)
            resources.system_update(env, res, fields, why=_why(source))

        await self._run(op)

    async def delete_team(self, org: str, source: str, team_id: str) -> None:
        await self._delete(f"{fqnmod.organization_fqn(org)}/teams/{team_id}", source)

    async def set_members(self, org: str, source: str, team_id: str, members: Membership) -> None:
        fqn = f"{fqnmod.organization_fqn(org)}/teams/{team_id}"
        users = sorted(f"{fqnmod.organization_fqn(org)}/users/{u}" for u in members.user_ids)
        teams = sorted(f"{fqnmod.organization_fqn(org)}/teams/{t}" for t in members.team_ids)

        def op(env: WriteEnv) -> None:
            res = self._owned(env.tx.conn, fqn, source)
            why = f": set its members from the {source} directory"
            res = resources.system_update(env, res, Team(members=users), why=why)
            # Nested teams are server-owned status (no client writes them).
            repo.set_status(env.tx.conn, fqn, {**res.status, "memberTeams": teams}, res.etag)

        await self._run(op)


def _why(source: str) -> str:
    return f" from the {source} directory"


# ---- last sync results ----------------------------------------------------------------------


class SyncRuns(TypedDict):
    """What ``GET .../directorySync`` shows of the log: the last run and the last good one."""

    lastResult: SyncResultJson | None
    lastSuccess: SyncResultJson | None


class SyncRunLog:
    """The last ``:sync`` body of each organization, and the last successful one."""

    def __init__(self, uow: UnitOfWork) -> None:
        self._uow = uow

    def record(self, org: str, result: SyncResultJson) -> None:
        body = json.dumps(result)
        values: dict[str, str | int] = {"last_result": body, "update_time": repo.now_us()}
        if result["ok"]:
            values["last_success"] = body
        with self._uow.write_rows() as conn:
            updated = conn.execute(
                sa.update(directory_sync_runs)
                .where(directory_sync_runs.c.organization == org)
                .values(**values)
            ).rowcount
            if not updated:
                conn.execute(sa.insert(directory_sync_runs).values(organization=org, **values))

    def get(self, org: str) -> SyncRuns:
        with self._uow.read() as conn:
            row = conn.execute(
                sa.select(directory_sync_runs).where(directory_sync_runs.c.organization == org)
            ).first()
        if row is None:
            return {"lastResult": None, "lastSuccess": None}
        return {
            "lastResult": json.loads(row.last_result),
            "lastSuccess": json.loads(row.last_success) if row.last_success else None,
        }


# ---- who is logging in ------------------------------------------------------------------------


def find_user_fqns(
    conn: Connection,
    *,
    scope: LoginScope,
    user_id: str | None,
    email: str | None,
    organization: str | None,
) -> list[str]:
    """The users ``scope`` may log in as whose ID (the name segment) is ``user_id``, or
    else whose email is ``email`` (``user_mapping`` says which records count).

    ``organization`` limits the search to that organization's users and the
    global ones. Email is matched case-insensitively and only when given
    (the caller passes only verified emails). Synced matches are returned
    alone when there are any (see ``user_mapping``).
    """
    parents = None
    if organization is not None:
        parents = [fqnmod.organization_fqn(organization), fqnmod.ROOT]
    candidates: list[tuple[str, dict[str, Any]]] = []
    if user_id:
        candidates = repo.find_specs(conn, USER_KIND, parents=parents, name=user_id)
    found = _eligible(conn, scope, candidates)
    if found or not email:
        return found
    needle = f'"email":{json.dumps(email.lower())}'
    candidates = [
        (fqn, spec)
        for fqn, spec in repo.find_specs(conn, USER_KIND, parents=parents, spec_contains=needle)
        if str(spec.get("email", "")).lower() == email.lower()
    ]
    return _eligible(conn, scope, candidates)


def _eligible(
    conn: Connection, scope: LoginScope, candidates: list[tuple[str, dict[str, Any]]]
) -> list[str]:
    by_kind: dict[str, list[str]] = {"synced": [], "bound": []}
    for fqn, spec in candidates:
        has_password = repo.get_password_hash(conn, fqn) is not None
        kind = match_kind(scope, fqn, spec, has_password=has_password)
        if kind is not None:
            by_kind[kind].append(fqn)
    return sorted(by_kind["synced"] or by_kind["bound"])
