"""The identity features of one running management plane: built at start, run in the lifespan.

``IdentityRuntime`` joins the building blocks of this package to the rest
of the app: the install config (``Settings.install_config``), the SQL stores,
the session tokens of ``Authenticator.mint``, and the periodic directory
sync. Without an ``identityProvider`` section ``service`` is ``None``: the
OIDC routes answer FAILED_PRECONDITION and ``/v2/oidc/configuration`` says
``enabled: false``.

Users must exist: a login finds the user record (by the token's subject,
``oid`` first for Entra ID, then a verified email) and never creates one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from sqlalchemy.engine import Engine

from mgmt_api.identity.config import IdentityProviderConfig, load_identity_provider
from mgmt_api.identity.errors import InvalidLoginError, TokenExchangeRefusedError
from mgmt_api.identity.oidc import VerifiedIdentity
from mgmt_api.identity.service import IdentityService
from mgmt_api.identity.sql_store import (
    SqlDirectoryStore,
    SqlLoginStateStore,
    SyncRunLog,
    find_user_fqns,
    org_fqn,
)
from mgmt_api.identity.sync.runner import DirectorySync, SyncResult
from mgmt_api.identity.token_exchange import ExchangeSubject, IssuedToken
from mgmt_api.service.authn import Authenticator
from mgmt_api.service.authz import Principal
from mgmt_api.store import repo
from mgmt_api.store.engine import read_tx

log = logging.getLogger(__name__)

PURGE_EVERY_S = 600.0


def _origin(url: str | None) -> tuple[str, ...]:
    if not url:
        return ()
    parts = urlsplit(url)
    return (f"{parts.scheme}://{parts.netloc}",) if parts.scheme and parts.netloc else ()


@dataclass
class IdentityRuntime:
    engine: Engine
    authn: Authenticator
    service: IdentityService | None = None
    http: httpx.AsyncClient | None = None
    states: SqlLoginStateStore | None = None
    runs: SyncRunLog | None = None
    syncs: dict[str, DirectorySync] = field(default_factory=dict)
    _stop: asyncio.Event | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        engine: Engine,
        authn: Authenticator,
        *,
        install_config: str | None,
        public_url: str | None = None,
        on_commit: Callable[[int], None] | None = None,
    ) -> IdentityRuntime:
        """Read the install config (a ``ConfigError`` stops the start-up, naming the line)."""
        runtime = cls(engine, authn)
        if install_config is None:
            return runtime
        config: IdentityProviderConfig = load_identity_provider(Path(install_config))
        if not config.oidc and config.sync is None:
            return runtime
        runtime.http = httpx.AsyncClient(timeout=10.0)
        runtime.states = SqlLoginStateStore(engine)
        runtime.runs = SyncRunLog(engine)
        runtime.service = IdentityService(
            config,
            http=runtime.http,
            states=runtime.states,
            allowed_return_origins=_origin(public_url),
        )
        store = SqlDirectoryStore(engine, on_commit)
        for org in config.sync.organizations if config.sync else ():
            sync = runtime.service.directory_sync(org, store)
            if sync is not None:
                runtime.syncs[org] = sync
        return runtime

    # ---- lifespan ----------------------------------------------------------------------

    async def start(self) -> None:
        """Start the periodic sync of every configured organization and the state purge."""
        if self.service is None:
            return
        self._stop = asyncio.Event()
        for org in self.syncs:
            self._tasks.append(asyncio.create_task(self._sync_forever(org, self._stop)))
        self._tasks.append(asyncio.create_task(self._purge_forever(self._stop)))

    async def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()
        for task in self._tasks:
            task.cancel()  # a run blocked on a slow directory must not hold up shutdown
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self.http is not None:
            await self.http.aclose()

    async def _sync_forever(self, org: str, stop: asyncio.Event) -> None:
        sync = self.syncs[org]
        while not stop.is_set():
            try:
                if await asyncio.to_thread(self._org_exists, org):
                    await self.sync_now(org)
                else:  # created later; ``:sync`` or the next round picks it up
                    log.warning("directory sync: organization %s does not exist yet", org)
            except Exception:  # a store outage must not end the job
                log.exception("directory sync of %s crashed", org)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=sync.interval_s)

    def _org_exists(self, org: str) -> bool:
        with read_tx(self.engine) as conn:
            return repo.exists(conn, org_fqn(org))

    async def _purge_forever(self, stop: asyncio.Event) -> None:
        assert self.states is not None
        while not stop.is_set():
            try:
                await asyncio.to_thread(self.states.purge_expired, time.time())
            except Exception:
                log.exception("purging expired logins failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=PURGE_EVERY_S)

    async def sync_now(self, org: str) -> SyncResult:
        """Run (or join) the sync of ``org`` and record its result for ``GET``."""
        result = await self.syncs[org].run_now()
        if self.runs is not None:
            await asyncio.to_thread(self.runs.record, org, result.to_json())
        return result

    # ---- users and tokens ---------------------------------------------------------------

    def _one_user(
        self, *, user_id: str | None, email: str | None, organization: str | None
    ) -> str | None:
        with read_tx(self.engine) as conn:
            found = find_user_fqns(conn, user_id=user_id, email=email, organization=organization)
        if len(found) > 1:
            raise InvalidLoginError(
                f"{len(found)} user records match this account ({', '.join(found[:5])}); "
                "log in with the organization given, or ask an administrator",
                reason="ambiguous_user",
            )
        return found[0] if found else None

    async def user_for_identity(
        self, identity: VerifiedIdentity, organization: str | None = None
    ) -> str | None:
        """The user FQN of a verified ID token: Entra ``oid``, then ``sub``, then verified email."""
        oid = identity.claims.get("oid")
        for user_id in (oid if isinstance(oid, str) else None, identity.subject):
            if user_id:
                found = await asyncio.to_thread(
                    self._one_user, user_id=user_id, email=None, organization=organization
                )
                if found is not None:
                    return found
        if identity.email and identity.email_verified:
            return await asyncio.to_thread(
                self._one_user, user_id=None, email=identity.email, organization=organization
            )
        return None

    async def user_with_id(self, user_id: str) -> str | None:
        """The token-exchange rule: the user record whose ID equals the token's subject."""
        try:
            return await asyncio.to_thread(
                self._one_user, user_id=user_id, email=None, organization=None
            )
        except InvalidLoginError as exc:
            raise TokenExchangeRefusedError(exc.message, reason=exc.reason) from exc

    def mint(self, user_fqn: str) -> IssuedToken:
        """A platform session token (the same kind ``POST /v2/auth/token`` issues)."""
        token, ttl = self.authn.mint(Principal(user_fqn, "user", frozenset({user_fqn})))
        return IssuedToken(access_token=token, expires_in=ttl)

    async def mint_exchanged(self, user_fqn: str, _subject: ExchangeSubject) -> IssuedToken:
        return self.mint(user_fqn)
