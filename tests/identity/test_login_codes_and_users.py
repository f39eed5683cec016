"""Login codes, the user mapping and the used-token cache on the server's real SQL schema.

Everything runs against a migrated SQLite database (the same tables and
statements ``mgmt-api serve`` uses); only the clock is passed in, so the
60-second expiry of a login code is tested without waiting a minute.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from mgmt_api.auth import passwords
from mgmt_api.identity.config import OidcConfig
from mgmt_api.identity.errors import InvalidLoginError, TokenExchangeRefusedError
from mgmt_api.identity.login_code import (
    CODE_TTL_S,
    InvalidGrantError,
    issue_code,
    redeem_code,
)
from mgmt_api.identity.oidc import VerifiedIdentity
from mgmt_api.identity.pkce import code_challenge_s256, new_code_verifier
from mgmt_api.identity.runtime import IdentityRuntime, provider_token_id
from mgmt_api.identity.secrets import SecretRef
from mgmt_api.identity.sql_store import SqlDirectoryStore, SqlLoginCodeStore, UsedTokenCache
from mgmt_api.identity.sync.model import DirectoryUser
from mgmt_api.identity.token_exchange import ExchangeSubject
from mgmt_api.identity.user_mapping import BINDING_LABEL
from mgmt_api.service.authn import Authenticator
from mgmt_api.store import repo
from mgmt_api.store.engine import write_tx
from mgmt_api.store.tables import oidc_login_codes
from mgmt_api.store.uow import UnitOfWork

NOW = 1_700_000_000.0
LOOPBACK = "http://127.0.0.1:5000/callback?state=s"

# ---- one-time login codes ----------------------------------------------------------------------


def new_code(store: SqlLoginCodeStore, verifier: str, config: str = "corp") -> str:
    return issue_code(
        store,
        config_name=config,
        user="organizations/acme/users/alice",
        code_challenge=code_challenge_s256(verifier),
        return_to=LOOPBACK,
        now=NOW,
    )


def form(code: str, verifier: str, **extra: str) -> dict[str, str]:
    return {"grant_type": "authorization_code", "code": code, "code_verifier": verifier, **extra}


def test_a_code_is_redeemed_once_with_its_verifier(sqlite_engine: Engine) -> None:
    store = SqlLoginCodeStore(UnitOfWork(sqlite_engine))
    verifier = new_code_verifier()
    code = new_code(store, verifier)
    user = redeem_code(
        store, form(code, verifier, redirect_uri=LOOPBACK), config_name="corp", now=NOW + 1
    )
    assert user == "organizations/acme/users/alice"
    with pytest.raises(InvalidGrantError, match="already used"):
        redeem_code(store, form(code, verifier), config_name="corp", now=NOW + 2)


def test_a_wrong_verifier_is_refused_and_burns_the_code(sqlite_engine: Engine) -> None:
    store = SqlLoginCodeStore(UnitOfWork(sqlite_engine))
    verifier = new_code_verifier()
    code = new_code(store, verifier)
    for wrong in (new_code_verifier(), "short", "é" * 50):
        with pytest.raises(InvalidGrantError):
            redeem_code(store, form(code, wrong), config_name="corp", now=NOW + 1)
    with pytest.raises(InvalidGrantError, match="already used"):
        redeem_code(store, form(code, verifier), config_name="corp", now=NOW + 1)


def test_an_expired_code_is_refused(sqlite_engine: Engine) -> None:
    store = SqlLoginCodeStore(UnitOfWork(sqlite_engine))
    verifier = new_code_verifier()
    code = new_code(store, verifier)
    with pytest.raises(InvalidGrantError, match="expired"):
        redeem_code(store, form(code, verifier), config_name="corp", now=NOW + CODE_TTL_S)
    fresh = new_code(store, verifier)
    assert store.purge_expired(NOW + CODE_TTL_S) == 1
    with pytest.raises(InvalidGrantError):
        redeem_code(store, form(fresh, verifier), config_name="corp", now=NOW + 1)


def test_a_code_belongs_to_its_configuration_and_redirect(sqlite_engine: Engine) -> None:
    store = SqlLoginCodeStore(UnitOfWork(sqlite_engine))
    verifier = new_code_verifier()
    with pytest.raises(InvalidGrantError, match="another OIDC configuration"):
        redeem_code(store, form(new_code(store, verifier), verifier), config_name="x", now=NOW)
    with pytest.raises(InvalidGrantError, match="redirect_uri"):
        redeem_code(
            store,
            form(new_code(store, verifier), verifier, redirect_uri="http://127.0.0.1:1/cb"),
            config_name="corp",
            now=NOW,
        )


def test_the_table_holds_no_redeemable_code(sqlite_engine: Engine) -> None:
    store = SqlLoginCodeStore(UnitOfWork(sqlite_engine))
    code = new_code(store, new_code_verifier())
    with sqlite_engine.connect() as conn:
        rows = conn.execute(sa.select(oidc_login_codes)).all()
    assert len(rows) == 1 and code not in json.dumps([list(r) for r in rows])


# ---- who a login may become ---------------------------------------------------------------------


def insert(engine: Engine, fqn: str, kind: str, spec: dict[str, Any]) -> None:
    parent, _, name = fqn.rpartition("/")
    parent = parent.rpartition("/")[0] if "/" in parent else ""
    with write_tx(engine) as conn:
        repo.insert(
            conn,
            repo.Resource(
                fqn=fqn, parent=parent, kind=kind, name=name, spec=spec, status={}, etag='"e"',
                protected=False, creator="test", create_time=0, update_time=0,
            ),
        )  # fmt: skip


def manual_user(engine: Engine, fqn: str, *, bound_to: str | None, password: bool) -> None:
    spec: dict[str, Any] = {"sourceType": "MANUAL", "email": "alice@example.test"}
    if bound_to is not None:
        spec["labels"] = {BINDING_LABEL: bound_to}
    insert(engine, fqn, "User", spec)
    if password:
        with write_tx(engine) as conn:
            repo.set_password_hash(conn, fqn, passwords.hash_password("local-password-1"))


def corp(**changes: Any) -> OidcConfig:
    config = OidcConfig(
        name="corp",
        client_id="web",
        client_secret=SecretRef("env", "UNUSED"),
        configuration_uri="https://idp.example/.well-known/openid-configuration",
        redirect_uri="https://mp.example/v2/oidc/callback",
        scopes=("email",),
        user_source_types=("AZURE",),
        user_organizations=("acme",),
    )
    return dataclasses.replace(config, **changes)


def identity(sub: str, oid: str | None = None, verified: bool = True) -> VerifiedIdentity:
    claims = {"sub": sub, **({"oid": oid} if oid else {})}
    return VerifiedIdentity("https://idp", sub, "alice@example.test", verified, None, claims)


@pytest.fixture
def runtime(sqlite_engine: Engine) -> IdentityRuntime:
    uow = UnitOfWork(sqlite_engine)
    rt = IdentityRuntime.build(uow, Authenticator(uow, "s" * 48), install_config=None)
    for org in ("acme", "other"):
        insert(sqlite_engine, f"organizations/{org}", "Organization", {})
    return rt


async def sync_users(rt: IdentityRuntime, org: str, source: str, *ids: str) -> None:
    store = rt.store
    assert isinstance(store, SqlDirectoryStore)
    for uid in ids:
        await store.create_user(org, source, DirectoryUser(uid, uid, email=f"{uid}@x.test"))


async def test_a_provider_account_never_becomes_a_local_or_unbound_user(
    runtime: IdentityRuntime, sqlite_engine: Engine
) -> None:
    """``sub=admin`` (a provider whose users choose their name) is not the bootstrap admin."""
    manual_user(sqlite_engine, "users/admin", bound_to=None, password=True)
    manual_user(sqlite_engine, "users/root", bound_to="corp", password=True)  # bound, but local
    manual_user(sqlite_engine, "organizations/acme/users/eve", bound_to=None, password=False)
    for sub in ("admin", "root", "eve"):
        assert await runtime.user_for_identity(identity(sub), corp()) is None, sub
    # Nor by email: every record above carries alice@example.test.
    assert await runtime.user_for_identity(identity("nobody"), corp()) is None


async def test_synced_users_match_only_for_their_source_and_organizations(
    runtime: IdentityRuntime,
) -> None:
    await sync_users(runtime, "acme", "AZURE", "oid-1")
    await sync_users(runtime, "other", "AZURE", "oid-2")
    await sync_users(runtime, "acme", "LDAP", "ldap-user")
    found = await runtime.user_for_identity(identity("pairwise-sub", oid="oid-1"), corp())
    assert found == "organizations/acme/users/oid-1"
    assert await runtime.user_for_identity(identity("x", oid="oid-2"), corp()) is None
    assert await runtime.user_for_identity(identity("ldap-user"), corp()) is None
    ldap = corp(user_source_types=("LDAP",))
    assert await runtime.user_for_identity(identity("ldap-user"), ldap) == (
        "organizations/acme/users/ldap-user"
    )
    # Another configuration (another provider) does not get the directory's users.
    other = corp(name="partners", user_source_types=(), user_organizations=())
    assert await runtime.user_for_identity(identity("x", oid="oid-1"), other) is None


async def test_bound_users_match_their_configuration_only(
    runtime: IdentityRuntime, sqlite_engine: Engine
) -> None:
    manual_user(sqlite_engine, "users/ci-robot", bound_to="corp", password=False)
    manual_user(sqlite_engine, "organizations/acme/users/partner", bound_to="p", password=False)
    assert await runtime.user_with_id("ci-robot", corp()) == "users/ci-robot"
    assert await runtime.user_with_id("ci-robot", corp(name="p")) is None
    assert await runtime.user_with_id("partner", corp()) is None
    assert await runtime.user_for_identity(identity("partner"), corp(name="p")) == (
        "organizations/acme/users/partner"
    )


async def test_email_needs_verification_and_synced_records_win_over_bound_ones(
    runtime: IdentityRuntime, sqlite_engine: Engine
) -> None:
    await sync_users(runtime, "acme", "AZURE", "alice")
    manual_user(sqlite_engine, "organizations/other/users/alice", bound_to="corp", password=False)
    # A user bound in another organization cannot make the directory user's login ambiguous.
    assert await runtime.user_for_identity(identity("alice"), corp()) == (
        "organizations/acme/users/alice"
    )
    assert await runtime.user_for_identity(identity("alice"), corp(), "other") == (
        "organizations/other/users/alice"
    )
    by_mail = identity("someone-else")
    by_mail = dataclasses.replace(by_mail, email="alice@x.test")
    assert await runtime.user_for_identity(by_mail, corp()) == "organizations/acme/users/alice"
    unverified = dataclasses.replace(by_mail, email_verified=False)
    assert await runtime.user_for_identity(unverified, corp()) is None


async def test_several_synced_matches_are_refused_not_guessed(runtime: IdentityRuntime) -> None:
    await sync_users(runtime, "acme", "AZURE", "dup")
    await sync_users(runtime, "other", "AZURE", "dup")
    both = corp(user_organizations=("acme", "other"))
    with pytest.raises(InvalidLoginError) as refused:
        await runtime.user_for_identity(identity("dup"), both)
    assert refused.value.reason == "ambiguous_user"
    assert await runtime.user_for_identity(identity("dup"), both, "other") == (
        "organizations/other/users/dup"
    )


# ---- exchanged tokens: lifetime and replay ------------------------------------------------------


def subject(expires_at: float, jti: str | None = "j-1") -> ExchangeSubject:
    claims: dict[str, Any] = {"iss": "https://idp", "exp": expires_at}
    if jti:
        claims["jti"] = jti
    return ExchangeSubject("robot", "robot", "https://idp", claims, expires_at=expires_at)


async def test_an_exchanged_token_never_outlives_the_provider_token(
    runtime: IdentityRuntime, sqlite_engine: Engine
) -> None:
    runtime.used_tokens = UsedTokenCache(UnitOfWork(sqlite_engine))
    issued = await runtime.mint_exchanged("users/robot", subject(time.time() + 120))
    assert 110 <= issued.expires_in <= 120
    long_lived = await runtime.mint_exchanged("users/robot", subject(time.time() + 99999, "j-2"))
    assert long_lived.expires_in == 3600  # the session lifetime still caps it
    with pytest.raises(TokenExchangeRefusedError) as expired:
        await runtime.mint_exchanged("users/robot", subject(time.time() - 10, "j-3"))
    assert expired.value.reason == "expired"


async def test_a_provider_token_is_exchanged_once(
    runtime: IdentityRuntime, sqlite_engine: Engine
) -> None:
    runtime.used_tokens = cache = UsedTokenCache(UnitOfWork(sqlite_engine))
    token = subject(time.time() + 300)
    await runtime.mint_exchanged("users/robot", token)
    with pytest.raises(TokenExchangeRefusedError) as replayed:
        await runtime.mint_exchanged("users/robot", token)
    assert replayed.value.reason == "token_replayed"
    # Without a unique id a token cannot be told from an identical fresh one: not cached.
    assert provider_token_id({"iss": "https://idp"}) == ""
    assert provider_token_id({"iss": "i", "uti": "u"}) == "i#uti:u"
    untracked = subject(time.time() + 300, jti=None)
    await runtime.mint_exchanged("users/robot", untracked)
    await runtime.mint_exchanged("users/robot", untracked)
    assert cache.purge_expired(time.time() + 10_000) == 1
