"""One-time login codes: how a browser login hands its session to a native client (RFC 8252).

A client such as ``meshctl login`` listens on a loopback port and passes
that address as ``redirectUri``. Any process on the machine can listen on
a loopback port, and a URL ends up in browser history, so the session token
itself must never travel there. Instead:

1. the client sends its own PKCE ``codeChallenge`` (S256) with the login;
2. after the provider login the server redirects to ``redirectUri`` with a
   one-time ``code`` valid ``CODE_TTL_S`` seconds;
3. the client redeems ``code`` with its ``code_verifier`` at
   ``POST /v2/oidc/token`` (``grant_type=authorization_code``) and only
   then gets the session token.

A code is single-use: ``take`` removes it whatever happens next, so a
wrong verifier burns it too (no second guess). Only the SHA-256 of the
code is stored, so the table holds nothing an observer could redeem.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from mgmt_api.identity.pkce import code_challenge_s256, new_random_token
from mgmt_api.identity.token_exchange import TokenExchangeRequestError

CODE_TTL_S = 60.0
AUTHORIZATION_CODE_GRANT = "authorization_code"


def code_digest(code: str) -> str:
    """What the store keeps of a login code."""
    return hashlib.sha256(code.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class LoginCode:
    """A pending hand-over of a completed login to the client behind ``return_to``."""

    code_hash: str = field(repr=False)
    config_name: str
    user: str
    """The user FQN the login resolved to."""
    code_challenge: str
    return_to: str
    expires_at: float


class LoginCodeStore(Protocol):
    def put(self, code: LoginCode) -> None:
        """Remember a new code."""

    def take(self, code_hash: str) -> LoginCode | None:
        """Remove and return the code, expired or not (it is consumed either way)."""

    def purge_expired(self, now: float) -> int:
        """Drop expired codes; returns how many were dropped."""


class InvalidGrantError(TokenExchangeRequestError):
    """RFC 6749 ``invalid_grant``: an unknown, used, expired or mismatched code."""

    def __init__(self, message: str) -> None:
        super().__init__("invalid_grant", message)


def issue_code(
    store: LoginCodeStore,
    *,
    config_name: str,
    user: str,
    code_challenge: str,
    return_to: str,
    now: float,
    ttl_s: float = CODE_TTL_S,
) -> str:
    """Store a new code for ``user`` and return it (the only place the plain code exists)."""
    code = new_random_token()
    store.put(
        LoginCode(
            code_hash=code_digest(code),
            config_name=config_name,
            user=user,
            code_challenge=code_challenge,
            return_to=return_to,
            expires_at=now + ttl_s,
        )
    )
    return code


def redeem_code(
    store: LoginCodeStore, form: Mapping[str, str], *, config_name: str, now: float
) -> str:
    """The user FQN of a valid ``grant_type=authorization_code`` request, or ``InvalidGrantError``.

    ``redirect_uri`` is optional (PKCE already binds the code to the client)
    but must match when sent, as RFC 6749 4.1.3 asks.
    """
    code = form.get("code")
    verifier = form.get("code_verifier")
    if not code or not verifier:
        raise TokenExchangeRequestError("invalid_request", "code and code_verifier are required")
    pending = store.take(code_digest(code))
    if pending is None or pending.expires_at <= now:
        raise InvalidGrantError("the login code is unknown, expired or was already used")
    if pending.config_name != config_name:
        raise InvalidGrantError("the login code belongs to another OIDC configuration")
    redirect_uri = form.get("redirect_uri")
    if redirect_uri and redirect_uri != pending.return_to:
        raise InvalidGrantError("redirect_uri differs from the login's redirectUri")
    try:
        challenge = code_challenge_s256(verifier)
    except (ValueError, UnicodeEncodeError):
        raise InvalidGrantError("the code_verifier does not match the login") from None
    if not hmac.compare_digest(challenge, pending.code_challenge):
        raise InvalidGrantError("the code_verifier does not match the login")
    return pending.user


class InMemoryLoginCodeStore:
    """A ``LoginCodeStore`` for one process (in-process tests)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._codes: dict[str, LoginCode] = {}

    def put(self, code: LoginCode) -> None:
        with self._lock:
            self._codes[code.code_hash] = code

    def take(self, code_hash: str) -> LoginCode | None:
        with self._lock:
            return self._codes.pop(code_hash, None)

    def purge_expired(self, now: float) -> int:
        with self._lock:
            expired = [h for h, c in self._codes.items() if c.expires_at <= now]
            for h in expired:
                del self._codes[h]
        return len(expired)
