"""Pending logins, keyed by the ``state`` parameter.

``state`` is what ties a callback to the login that started it. It is
single-use (a replayed callback finds nothing), expires (an abandoned login
cannot be completed hours later), and carries the secrets the callback
needs and the browser must never see: the PKCE verifier and the nonce.

Binding to the browser: the login endpoint sets a cookie holding a fresh
random value, independent of ``state``, and the pending login keeps only
its SHA-256 digest (``binding_hash``). The callback must present the
cookie. ``state`` travels in URLs (the provider's redirect, browser history,
proxy logs) while the cookie never leaves the browser that started the
login, so whoever captures the callback URL still cannot finish the login
first; and because only the digest is stored, a read of the login-state
table does not yield usable cookies either. The REST layer passes the
cookie value in; this module only compares.

Stores: ``InMemoryLoginStateStore`` is correct for one process (a lock
makes ``take`` atomic) and serves the in-process tests of the login logic.
The server uses ``sql_store.SqlLoginStateStore`` (the ``login_states``
table; ``take`` is one ``DELETE ... RETURNING`` statement). Both are
bounded: an unauthenticated client can start logins at will, so past
``max_pending`` live rows a new login is refused rather than the store
growing without limit.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
from dataclasses import dataclass
from typing import Protocol

from mgmt_api.identity.pkce import new_random_token

DEFAULT_LOGIN_TTL_S = 600.0
MAX_PENDING_LOGINS = 10_000


def binding_digest(cookie_value: str) -> str:
    """What the store keeps of a login cookie: its SHA-256, hex."""
    return hashlib.sha256(cookie_value.encode()).hexdigest()


def new_browser_binding() -> tuple[str, str]:
    """A fresh login cookie value and its digest (the cookie is 256 random bits)."""
    value = new_random_token()
    return value, binding_digest(value)


@dataclass(frozen=True, slots=True)
class LoginState:
    """Everything the callback needs to finish one login."""

    state: str
    config_name: str
    nonce: str
    code_verifier: str
    redirect_uri: str
    """Where the provider sends the browser back (our callback)."""
    return_to: str | None
    """Where the user goes after login (the ``redirectUri`` query parameter)."""
    created_at: float
    expires_at: float
    binding_hash: str
    """``binding_digest`` of the login cookie; the cookie itself is never stored."""
    client_challenge: str | None = None
    """The PKCE S256 challenge of the client behind ``return_to`` (RFC 8252): the
    one-time login code sent there is redeemed only with the matching verifier."""

    def bound_to(self, cookie_value: str | None) -> bool:
        """True when ``cookie_value`` is the cookie this login set."""
        return cookie_value is not None and hmac.compare_digest(
            binding_digest(cookie_value), self.binding_hash
        )


class LoginStateStore(Protocol):
    """Storage of pending logins; ``take`` must be atomic."""

    def put(self, login: LoginState) -> None:
        """Remember a new pending login (``TooManyPendingLoginsError`` when full)."""

    def take(self, state: str, now: float) -> LoginState | None:
        """Remove and return the login for ``state`` if it exists and has not expired."""

    def purge_expired(self, now: float) -> int:
        """Drop expired logins; returns how many were dropped."""


class TooManyPendingLoginsError(Exception):
    """The store is full: refuse new logins rather than grow without bound."""

    def __init__(self) -> None:
        super().__init__("too many logins are in progress; try again in a few minutes")


class InMemoryLoginStateStore:
    """A ``LoginStateStore`` for a single process."""

    def __init__(self, max_pending: int = MAX_PENDING_LOGINS) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, LoginState] = {}
        self._max = max_pending

    def put(self, login: LoginState) -> None:
        with self._lock:
            if len(self._pending) >= self._max:
                self._purge_locked(login.created_at)
            if len(self._pending) >= self._max:
                raise TooManyPendingLoginsError()
            self._pending[login.state] = login

    def take(self, state: str, now: float) -> LoginState | None:
        with self._lock:
            login = self._pending.pop(state, None)
        if login is None or login.expires_at <= now:
            return None
        return login

    def purge_expired(self, now: float) -> int:
        with self._lock:
            return self._purge_locked(now)

    def _purge_locked(self, now: float) -> int:
        expired = [s for s, login in self._pending.items() if login.expires_at <= now]
        for s in expired:
            del self._pending[s]
        return len(expired)

    def __len__(self) -> int:
        return len(self._pending)
