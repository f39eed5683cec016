"""Authentication: turns an ``Authorization`` header into a Principal.

* ``Basic``: local users. The login name ``admin`` (no slash) is a global
  user ``users/admin``; ``org/name`` is ``organizations/org/users/name``.
  Failures are throttled per (login name, client address) pair (5 free
  failures, then a lock-out doubling per failure up to 5 minutes) and, with
  a much higher allowance (100), per client address. The pair stops guessing
  one account's password from one place without letting anyone lock an
  account out for everybody else: a client that sends wrong passwords for
  ``admin`` locks out only itself. The per-address allowance slows spraying
  across many accounts without letting one bad client behind a shared NAT
  lock everyone out. Guessing from many addresses is bounded by Argon2's
  cost per attempt; put a rate limit in front of the API for more.
* Bearer failures are not throttled: signatures cannot be guessed.
* ``Bearer``: a management-plane session token (header ``kid`` =
  ``meshplane-session``) or a JWT signed by a service-account key (``kid`` =
  key id). Every request re-checks that the principal, and for service
  accounts the key, still exist: deleting a cluster revokes its agent at once.
"""

from __future__ import annotations

import base64
import binascii
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from sqlalchemy.engine import Connection

from meshplane.kinds_contract import Kind
from mgmt_api import fqn as fqnmod
from mgmt_api.access import Principal
from mgmt_api.auth import tokens
from mgmt_api.auth.passwords import VerifiedCache
from mgmt_api.auth.tokens import jwt_exp
from mgmt_api.domain.durations import parse_duration
from mgmt_api.domain.throttle import FailureThrottle
from mgmt_api.errors import ApiError, Code, unauthenticated
from mgmt_api.kinds import subject_field
from mgmt_api.store import repo
from mgmt_api.store.uow import UnitOfWork

DEFAULT_TOKEN_TTL = 3600.0


def login_to_fqn(login: str) -> str:
    """Map a Basic login name to a user FQN (400-free: bad names just fail auth)."""
    if "/" in login:
        org, _, user = login.partition("/")
        return f"organizations/{org}/users/{user}"
    return f"users/{login}"


def principal_for(conn: Connection, fqn: str, subject_field: str) -> Principal:
    """The principal with its team memberships (teams live in its organization)."""
    subjects = {fqn}
    org = fqnmod.parse(fqn).organization
    nested: list[tuple[str, list[str]]] = []
    if org:
        after = ""
        while True:
            teams = repo.list_children(conn, org, Kind.TEAM, after, 500)
            for team in teams:
                if fqn in (team.spec.get("members") or []):
                    subjects.add(team.fqn)
                if team.status.get("memberTeams"):
                    nested.append((team.fqn, team.status["memberTeams"]))
            if len(teams) < 500:
                break
            after = teams[-1].fqn
    # Nested directory groups (status.memberTeams, written by the directory sync):
    # a member of a team nested in another is a member of that one too.
    grown = True
    while grown:
        grown = False
        for team_fqn, inner in nested:
            if team_fqn not in subjects and any(t in subjects for t in inner):
                subjects.add(team_fqn)
                grown = True
    return Principal(fqn, subject_field, frozenset(subjects))


def service_account_ttl(conn: Connection, sa_fqn: str) -> float:
    """Max token lifetime: the owning cluster's ``tokenTtl`` for a cluster's account."""
    parent = fqnmod.parse(sa_fqn).parent
    if fqnmod.cluster_of(sa_fqn) == parent:
        cluster = repo.get(conn, parent)
        ttl = cluster.spec.get("tokenTtl") if cluster is not None else None
        if isinstance(ttl, str):
            return parse_duration(ttl, "tokenTtl")
    return DEFAULT_TOKEN_TTL


class Authenticator:
    def __init__(
        self,
        uow: UnitOfWork,
        signing_secret: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._uow = uow
        self._secret = signing_secret
        self._clock = clock
        self._by_login = FailureThrottle(free_failures=5)  # keyed by (client, login)
        self._by_client = FailureThrottle(free_failures=100)
        self._cache = VerifiedCache()
        # token -> (store revision, principal, expiry); see ``bearer``.
        self._tokens: OrderedDict[str, tuple[int, Principal, float]] = OrderedDict()
        self._tokens_lock = threading.Lock()

    @staticmethod
    def _pair(login: str, client: str) -> str:
        return f"{client}\x00{login}"

    def _check_throttle(self, login: str, client: str) -> None:
        now = self._clock()
        wait = max(
            self._by_login.retry_after(self._pair(login, client), now),
            self._by_client.retry_after(client, now),
        )
        if wait > 0:
            raise ApiError(
                Code.RESOURCE_EXHAUSTED,
                "too many failed authentication attempts; retry later",
                headers={"Retry-After": str(int(wait) + 1)},
            )

    def _fail(self, login: str, client: str) -> ApiError:
        now = self._clock()
        self._by_login.failure(self._pair(login, client), now)
        self._by_client.failure(client, now)
        return unauthenticated("invalid credentials")

    def basic(self, login: str, password: str, client: str) -> Principal:
        self._check_throttle(login, client)
        try:
            fqn = login_to_fqn(login)
            fqnmod.parse(fqn)
        except ApiError:
            raise self._fail(login, client) from None
        with self._uow.read() as conn:
            stored = repo.get_password_hash(conn, fqn)
            if stored is None or not self._cache.verify(fqn, password, stored):
                raise self._fail(login, client)
            if not repo.exists(conn, fqn):
                raise self._fail(login, client)
            principal = principal_for(conn, fqn, "user")
        self._by_login.success(self._pair(login, client))
        return principal

    def bearer(self, token: str, client: str) -> Principal:
        """Principal of a bearer token.

        A verified token and the principal it resolved to are remembered
        together with the store revision they were resolved at. Every write
        bumps that revision (deleting a user, key, account or cluster, editing
        a team or a ``tokenTtl``), so a cache hit is exactly as fresh as a full
        check: one cheap revision read replaces the signature verification and
        three lookups. Expiry is still checked on every request.
        """
        now = self._clock()
        try:
            with self._uow.read() as conn:
                revision = repo.current_revision(conn)
                hit = self._tokens.get(token)
                if hit is not None and hit[0] == revision and hit[2] + tokens.LEEWAY_SECONDS >= now:
                    return hit[1]
                principal, expires = self._resolve_bearer(conn, token, now)
            with self._tokens_lock:
                self._tokens[token] = (revision, principal, expires)
                while len(self._tokens) > 10_000:
                    self._tokens.popitem(last=False)
            return principal
        except (tokens.TokenError, ApiError) as exc:
            if isinstance(exc, ApiError) and exc.code is not Code.INVALID_ARGUMENT:
                raise
            message = str(exc) if isinstance(exc, tokens.TokenError) else "invalid token"
            raise unauthenticated(message) from None

    def _resolve_bearer(self, conn: Connection, token: str, now: float) -> tuple[Principal, float]:
        kid = tokens.header_kid(token)
        if kid == tokens.SESSION_KID:
            subject = tokens.verify_session(self._secret, token, now)
            parsed = fqnmod.parse(subject)
            if not repo.exists(conn, subject):
                raise tokens.TokenError("principal no longer exists")
            return principal_for(conn, subject, subject_field(parsed.kind)), jwt_exp(token)
        key = repo.get_key(conn, kid)
        if key is None:
            raise tokens.TokenError("unknown or revoked key")
        owner, jwk = key
        claims = tokens.verify_service_account(jwk, token, now, service_account_ttl(conn, owner))
        return principal_for(conn, owner, "serviceAccount"), claims.expires_at

    def authenticate(self, authorization: str | None, client: str) -> Principal:
        if not authorization:
            raise unauthenticated()
        scheme, _, value = authorization.partition(" ")
        scheme = scheme.lower()
        value = value.strip()
        if scheme == "basic":
            try:
                decoded = base64.b64decode(value, validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                raise unauthenticated("malformed Basic credentials") from None
            login, sep, password = decoded.partition(":")
            if not sep:
                raise unauthenticated("malformed Basic credentials")
            return self.basic(login, password, client)
        if scheme == "bearer" and value:
            return self.bearer(value, client)
        raise unauthenticated("unsupported authorization scheme")

    def mint(self, principal: Principal, max_ttl: int | None = None) -> tuple[str, int]:
        """A session token for ``principal`` and its lifetime in seconds.

        ``max_ttl`` shortens the usual lifetime, never lengthens it: a token
        exchanged for a provider credential must not outlive that credential.
        """
        ttl = tokens.SESSION_TTL_SECONDS
        if max_ttl is not None:
            ttl = max(1, min(ttl, max_ttl))
        return tokens.mint_session(self._secret, principal.fqn, self._clock(), ttl), ttl
