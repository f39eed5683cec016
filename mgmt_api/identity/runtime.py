"""The identity features of one running management plane: built at start, run in the lifespan.

``IdentityRuntime`` joins the building blocks of this package to the rest
of the app: the install config (``Settings.install_config``), the SQL stores,
the session tokens of ``Authenticator.mint``, and the periodic directory
sync. Without an ``identityProvider`` section ``service`` is ``None``: the
OIDC routes answer FAILED_PRECONDITION and ``/v2/oidc/configuration`` says
``enabled: false``; the push-style ``SyncOrganization`` still works, since
it needs no configured source.

Users must exist: a login finds the user record (by the token's subject,
``oid`` first for Entra ID, then a verified email) among the records the
OIDC configuration may log in as (``user_mapping``) and never creates one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from mgmt_api import access
from mgmt_api import fqn as fqnmod
from mgmt_api.access import CallContext, Principal
from mgmt_api.errors import not_found
from mgmt_api.identity.config import (
    DEFAULT_MAX_DELETE_PERCENT,
    IdentityProviderConfig,
    OidcConfig,
    load_identity_provider,
)
from mgmt_api.identity.errors import InvalidLoginError, TokenExchangeRefusedError
from mgmt_api.identity.login_code import issue_code, redeem_code
from mgmt_api.identity.oidc import LoginResult, VerifiedIdentity
from mgmt_api.identity.service import IdentityService
from mgmt_api.identity.sql_store import (
    SqlDirectoryStore,
    SqlLoginCodeStore,
    SqlLoginStateStore,
    SyncRunLog,
    UsedTokenCache,
    find_user_fqns,
)
from mgmt_api.identity.sync.model import DirectoryTeam, DirectoryUser
from mgmt_api.identity.sync.runner import (
    DirectorySync,
    StaticSource,
    SyncResult,
    run_sync,
)
from mgmt_api.identity.token_exchange import ExchangeSubject, IssuedToken
from mgmt_api.identity.user_mapping import LoginScope
from mgmt_api.service.authn import Authenticator
from mgmt_api.service.replicas import Claim, run_each_period
from mgmt_api.store import repo
from mgmt_api.store.uow import UnitOfWork

log = logging.getLogger(__name__)

PURGE_EVERY_S = 600.0
USED_TOKEN_LEEWAY_S = 120.0
"""Used-token entries outlive the token by the verification leeway, so a token that
still passes the ``exp`` check can never be replayed after its entry is purged."""


def _origin(url: str | None) -> tuple[str, ...]:
    if not url:
        return ()
    parts = urlsplit(url)
    return (f"{parts.scheme}://{parts.netloc}",) if parts.scheme and parts.netloc else ()


def provider_token_id(claims: Mapping[str, object]) -> str:
    """The replay-cache key of a provider token: its issuer and unique id, or ``""``.

    The unique id is ``jti`` (RFC 7519), or ``uti``, which Entra ID puts into
    its tokens instead. A token with neither cannot be told apart from an
    identical one issued in the same second for a fresh login (ID tokens
    without a nonce often are), so it is not cached rather than refused.
    """
    iss = claims.get("iss")
    for name in ("jti", "uti"):
        value = claims.get(name)
        if isinstance(value, str) and value and isinstance(iss, str):
            return f"{iss}#{name}:{value}"
    return ""


#: The pseudo-kind roles grant directory sync with (``:sync`` and its results).
SYNC_KIND = "DirectorySync"


@dataclass
class IdentityRuntime:
    uow: UnitOfWork
    authn: Authenticator
    service: IdentityService | None = None
    http: httpx.AsyncClient | None = None
    states: SqlLoginStateStore | None = None
    codes: SqlLoginCodeStore | None = None
    used_tokens: UsedTokenCache | None = None
    store: SqlDirectoryStore | None = None
    runs: SyncRunLog | None = None
    syncs: dict[str, DirectorySync] = field(default_factory=dict)
    clock: Callable[[], float] = time.time
    #: (job, period) → whether this replica runs it (once per period across replicas).
    claim: Claim = lambda _job, _period: True
    purge_interval: float = PURGE_EVERY_S
    _stop: asyncio.Event | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _push_locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        uow: UnitOfWork,
        authn: Authenticator,
        *,
        install_config: str | None,
        public_url: str | None = None,
        purge_interval: float = PURGE_EVERY_S,
        claim: Claim | None = None,
    ) -> IdentityRuntime:
        """Read the install config (a ``ConfigError`` stops the start-up, naming the line)."""
        runtime = cls(uow, authn, purge_interval=purge_interval)
        if claim is not None:
            runtime.claim = claim
        runtime.store = SqlDirectoryStore(uow)
        runtime.runs = SyncRunLog(uow)
        # Purged whether or not logins are configured: rows of an earlier config expire too.
        runtime.states = SqlLoginStateStore(uow)
        runtime.codes = SqlLoginCodeStore(uow)
        runtime.used_tokens = UsedTokenCache(uow)
        if install_config is None:
            return runtime
        config: IdentityProviderConfig = load_identity_provider(Path(install_config))
        if not config.oidc and config.sync is None:
            return runtime
        runtime.http = httpx.AsyncClient(timeout=10.0)
        runtime.service = IdentityService(
            config,
            http=runtime.http,
            states=runtime.states,
            allowed_return_origins=_origin(public_url),
        )
        for org in config.sync.organizations if config.sync else ():
            sync = runtime.service.directory_sync(org, runtime.store)
            if sync is not None:
                runtime.syncs[org] = sync
        return runtime

    # ---- lifespan ----------------------------------------------------------------------

    async def start(self) -> None:
        """Start the periodic sync of every configured organization and the purges."""
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
        """The periodic job: once per ``interval`` across replicas, until ``stop``.

        The one loop of the periodic sync (``DirectorySync`` only runs single
        syncs): it skips an organization that does not exist yet and records
        every result for ``GET .../directorySync``.
        """

        async def once() -> None:
            if await asyncio.to_thread(self._org_exists, org):
                await self.sync_now(org)
            else:  # created later; ``:sync`` or the next round picks it up
                log.warning("directory sync: organization %s does not exist yet", org)

        interval = self.syncs[org].interval_s
        await run_each_period(
            f"directory-sync/{org}", interval, once, claim=self.claim, stop=stop, clock=self.clock
        )

    # ---- directory sync on demand (``:sync``) ---------------------------------------------

    def authorize_sync(self, ctx: CallContext, org: str, permission: str) -> None:
        """``permission`` for the ``DirectorySync`` kind on the organization, which must exist."""
        fqn = fqnmod.organization_fqn(org)
        with self.uow.read() as conn:
            access.require(conn, ctx.principal, fqn, SYNC_KIND, permission)
            if not repo.exists(conn, fqn):
                raise not_found(fqn)

    def audit_sync(self, ctx: CallContext, org: str, result: SyncResult, mode: str) -> None:
        """One audit record per ``:sync`` call, whatever its outcome, by the caller."""
        body = result.to_json()
        fqn = fqnmod.organization_fqn(org)
        outcome = "ok" if result.ok else str(result.error)
        with self.uow.write(ctx.principal.fqn, bump=False) as tx:
            tx.audit(
                fqn,
                SYNC_KIND,
                "SYNC",
                f"directory sync ({mode}) of {fqn} from {result.source_type}: {outcome}",
                ok=result.ok,
                mode=mode,
                forced=result.forced,
                users=body["users"],
                teams=body["teams"],
            )

    def _org_exists(self, org: str) -> bool:
        with self.uow.read() as conn:
            return repo.exists(conn, fqnmod.organization_fqn(org))

    def _purge(self, now: float) -> None:
        for store in (self.states, self.codes, self.used_tokens):
            if store is not None:
                store.purge_expired(now)

    async def _purge_forever(self, stop: asyncio.Event) -> None:
        async def once() -> None:
            await asyncio.to_thread(self._purge, self.clock())

        await run_each_period(
            "purge-expired-logins",
            self.purge_interval,
            once,
            claim=self.claim,
            stop=stop,
            clock=self.clock,
        )

    # ---- directory sync -------------------------------------------------------------------

    async def _record(self, org: str, result: SyncResult) -> None:
        if self.runs is not None:
            await asyncio.to_thread(self.runs.record, org, result.to_json())

    async def sync_now(self, org: str, *, force: bool = False) -> SyncResult:
        """Run (or join) the pull sync of ``org`` and record its result for ``GET``."""
        result = await self.syncs[org].run_now(force=force)
        await self._record(org, result)
        return result

    def max_delete_percent(self) -> int:
        sync = self.service.config.sync if self.service is not None else None
        return sync.max_delete_percent if sync is not None else DEFAULT_MAX_DELETE_PERCENT

    async def push_sync(
        self,
        org: str,
        source_type: str,
        users: list[DirectoryUser],
        teams: list[DirectoryTeam],
        *,
        force: bool = False,
    ) -> SyncResult:
        """A push-style ``SyncOrganization``: the given directory is applied as a full sync.

        Runs of the same organization and source type are serialized in this
        process; the reconcile itself plans from the store, so a run on
        another replica at the same time only makes one of them redo work.
        """
        assert self.store is not None
        lock = self._push_locks.setdefault((org, source_type), asyncio.Lock())
        async with lock:
            result = await run_sync(
                org,
                StaticSource(source_type, users, teams),
                self.store,
                clock=self.clock,
                max_delete_percent=self.max_delete_percent(),
                force=force,
            )
        await self._record(org, result)
        return result

    # ---- users and tokens ---------------------------------------------------------------

    def _one_user(
        self,
        scope: LoginScope,
        *,
        user_id: str | None,
        email: str | None,
        organization: str | None,
    ) -> str | None:
        with self.uow.read() as conn:
            found = find_user_fqns(
                conn, scope=scope, user_id=user_id, email=email, organization=organization
            )
        if len(found) > 1:
            raise InvalidLoginError(
                f"{len(found)} user records match this account ({', '.join(found[:5])}); "
                "log in with the organization given, or ask an administrator",
                reason="ambiguous_user",
            )
        return found[0] if found else None

    async def user_for_identity(
        self, identity: VerifiedIdentity, config: OidcConfig, organization: str | None = None
    ) -> str | None:
        """The user FQN of a verified ID token: Entra ``oid``, then ``sub``, then verified
        email, among the users ``config`` may log in as."""
        scope = LoginScope.of(config)
        oid = identity.claims.get("oid")
        for user_id in (oid if isinstance(oid, str) else None, identity.subject):
            if user_id:
                found = await asyncio.to_thread(
                    self._one_user, scope, user_id=user_id, email=None, organization=organization
                )
                if found is not None:
                    return found
        if identity.email and identity.email_verified:
            return await asyncio.to_thread(
                self._one_user, scope, user_id=None, email=identity.email, organization=organization
            )
        return None

    async def user_with_id(self, user_id: str, config: OidcConfig) -> str | None:
        """The token-exchange rule: the user record whose ID equals the token's subject."""
        try:
            return await asyncio.to_thread(
                self._one_user,
                LoginScope.of(config),
                user_id=user_id,
                email=None,
                organization=None,
            )
        except InvalidLoginError as exc:
            raise TokenExchangeRefusedError(exc.message, reason=exc.reason) from exc

    def use_provider_token(self, token_id: str, expires_at: float) -> None:
        """Each provider token becomes a platform token once (``token_replayed`` after);
        ``token_id`` is ``provider_token_id`` (empty: the token cannot be told apart)."""
        if self.used_tokens is None or not token_id:
            return
        if not self.used_tokens.use(token_id, expires_at + USED_TOKEN_LEEWAY_S):
            raise TokenExchangeRefusedError(
                "this provider token was already exchanged; get a new one from the identity "
                "provider",
                reason="token_replayed",
            )

    def mint(self, user_fqn: str, max_ttl: int | None = None) -> IssuedToken:
        """A platform session token (the same kind ``POST /v2/auth/token`` issues)."""
        token, ttl = self.authn.mint(Principal(user_fqn, "user", frozenset({user_fqn})), max_ttl)
        return IssuedToken(access_token=token, expires_in=ttl)

    async def mint_exchanged(self, user_fqn: str, subject: ExchangeSubject) -> IssuedToken:
        """Token exchange: at most the provider token's remaining lifetime, once per token."""
        remaining = int(subject.expires_at - self.clock())
        if remaining < 1:
            raise TokenExchangeRefusedError("the access token has expired", reason="expired")
        token_id = provider_token_id(subject.claims)
        await asyncio.to_thread(self.use_provider_token, token_id, subject.expires_at)
        return await asyncio.to_thread(self.mint, user_fqn, remaining)

    def issue_login_code(self, result: LoginResult[str]) -> str:
        """The one-time code for the client behind ``result.return_to`` (RFC 8252)."""
        assert self.codes is not None
        assert result.return_to is not None and result.client_challenge is not None
        return issue_code(
            self.codes,
            config_name=result.config_name,
            user=result.user,
            code_challenge=result.client_challenge,
            return_to=result.return_to,
            now=self.clock(),
        )

    def redeem_login_code(self, form: dict[str, str], config: OidcConfig) -> IssuedToken:
        """``grant_type=authorization_code``: the session token for a login code + verifier."""
        assert self.codes is not None
        user = redeem_code(self.codes, form, config_name=config.name, now=self.clock())
        with self.uow.read() as conn:
            if not repo.exists(conn, user):  # deleted in the seconds since the login
                raise TokenExchangeRefusedError("the user no longer exists", reason="unknown_user")
        return self.mint(user)
