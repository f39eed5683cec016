"""Authentication: turns an ``Authorization`` header into a Principal.

* ``Basic``: local users. The login name ``admin`` (no slash) is a global
  user ``users/admin``; ``org/name`` is ``organizations/org/users/name``.
  Failures are throttled by :class:`~mgmt_api.domain.throttle.LoginThrottle`
  (per client address and login, per address, and per login under attack),
  which only ever refuses an address that has failed itself: nobody can lock
  ``admin`` out for everybody else. The client address is the one the
  request carries (behind trusted proxies, the forwarded one:
  :mod:`mgmt_api.domain.client_address`). Every attempt that is not a cached
  success costs one Argon2 verification, a login name without a password
  included, so answer times do not tell which names exist.
* Bearer failures are not throttled: signatures cannot be guessed.
* Session tokens record a digest of their user's stored password hash
  (:func:`~mgmt_api.auth.tokens.credential_stamp`): a password change or
  reset ends every session and console sign-in of that user.
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
from mgmt_api.domain.throttle import LoginThrottle, ThrottleRule
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
        passwords: VerifiedCache | None = None,
        throttle: ThrottleRule | None = None,
    ) -> None:
        self._uow = uow
        self._secret = signing_secret
        self._clock = clock
        self._throttle = LoginThrottle(throttle)
        self._cache = passwords or VerifiedCache()
        # token -> (store revision, principal, expiry); see ``bearer``.
        self._tokens: OrderedDict[str, tuple[int, Principal, float]] = OrderedDict()
        self._tokens_lock = threading.Lock()

    def _check_throttle(self, login: str, client: str) -> None:
        wait = self._throttle.retry_after(client, login, self._clock())
        if wait > 0:
            raise ApiError(
                Code.RESOURCE_EXHAUSTED,
                "too many failed authentication attempts; retry later",
                headers={"Retry-After": str(int(wait) + 1)},
            )

    def _fail(self, login: str, client: str) -> ApiError:
        self._throttle.failure(client, login, self._clock())
        return unauthenticated("invalid credentials")

    def basic(self, login: str, password: str, client: str) -> Principal:
        return self._basic(login, password, client)[0]

    def _basic(self, login: str, password: str, client: str) -> tuple[Principal, str]:
        """The principal and the stored hash the password was verified against.

        The verifier runs exactly once per attempt, whether or not the login
        names a user with a password (a dummy hash stands in).
        """
        self._check_throttle(login, client)
        fqn = login_to_fqn(login)
        try:
            fqnmod.parse(fqn)
        except ApiError:
            self._cache.verify(fqn, password, None)
            raise self._fail(login, client) from None
        with self._uow.read() as conn:
            stored = repo.get_password_hash(conn, fqn)
            if not self._cache.verify(fqn, password, stored) or stored is None:
                raise self._fail(login, client)
            if not repo.exists(conn, fqn):
                raise self._fail(login, client)
            principal = principal_for(conn, fqn, "user")
        self._throttle.success(client, login)
        return principal, stored

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
            session = tokens.verify_session(self._secret, token, now)
            subject = session.subject
            parsed = fqnmod.parse(subject)
            if not repo.exists(conn, subject):
                raise tokens.TokenError("principal no longer exists")
            stored = repo.get_password_hash(conn, subject)
            if session.stamp != tokens.credential_stamp(self._secret, stored):
                raise tokens.TokenError("session ended: the password was changed since")
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
            return self.basic(*_basic_credentials(value), client)
        if scheme == "bearer" and value:
            return self.bearer(value, client)
        raise unauthenticated("unsupported authorization scheme")

    def login(self, authorization: str, client: str) -> tuple[Principal, str, int]:
        """``POST /v2/auth/token``: Basic credentials for a session token.

        The token is stamped with the very hash the password was verified
        against, so a reset racing this call still ends the session it issues.
        """
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() != "basic":
            raise unauthenticated("Basic credentials required to obtain a token")
        principal, stored = self._basic(*_basic_credentials(value.strip()), client)
        token, ttl = self._mint(principal.fqn, stored, None)
        return principal, token, ttl

    def mint(self, principal: Principal, max_ttl: int | None = None) -> tuple[str, int]:
        """A session token for ``principal`` and its lifetime in seconds.

        ``max_ttl`` shortens the usual lifetime, never lengthens it: a token
        exchanged for a provider credential must not outlive that credential.
        """
        with self._uow.read() as conn:
            stored = repo.get_password_hash(conn, principal.fqn)
        return self._mint(principal.fqn, stored, max_ttl)

    def _mint(self, fqn: str, stored: str | None, max_ttl: int | None) -> tuple[str, int]:
        ttl = tokens.SESSION_TTL_SECONDS
        if max_ttl is not None:
            ttl = max(1, min(ttl, max_ttl))
        stamp = tokens.credential_stamp(self._secret, stored)
        return tokens.mint_session(self._secret, fqn, self._clock(), stamp, ttl), ttl


def _basic_credentials(value: str) -> tuple[str, str]:
    """``login:password`` of a Basic ``Authorization`` value (401 if malformed)."""
    try:
        decoded = base64.b64decode(value, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise unauthenticated("malformed Basic credentials") from None
    login, sep, password = decoded.partition(":")
    if not sep:
        raise unauthenticated("malformed Basic credentials")
    return login, password
