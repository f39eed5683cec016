"""Pending logins, keyed by the ``state`` parameter.

``state`` is what ties a callback to the login that started it. It is
single-use (a replayed callback finds nothing), expires (an abandoned login
cannot be completed hours later), and carries the secrets the callback
needs and the browser must never see: the PKCE verifier and the nonce.

Binding to the browser: the login endpoint also sets a cookie holding a
digest of the state (``browser_binding``); the callback must present the
same cookie, so a state value stolen from a URL cannot be completed from
another browser. The REST layer passes the cookie value in; this module
only compares.

Stores: ``InMemoryLoginStateStore`` is correct for one process (a lock
makes ``take`` atomic). With several workers or replicas, the SQL store will
implement the same protocol with a ``login_states`` table (state primary key,
JSON payload, ``expires_at``) and ``take`` as ``DELETE ... WHERE state = :s
AND expires_at > :now RETURNING payload``: one statement, so two racing
callbacks cannot both win, and expired rows are purged by ``purge_expired``.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
from dataclasses import dataclass
from typing import Protocol

DEFAULT_LOGIN_TTL_S = 600.0
MAX_PENDING_LOGINS = 10_000


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

    @property
    def browser_binding(self) -> str:
        """The value of the cookie that binds this login to the browser that started it."""
        return hashlib.sha256(("meshplane-login:" + self.state).encode()).hexdigest()

    def bound_to(self, cookie_value: str | None) -> bool:
        return cookie_value is not None and hmac.compare_digest(
            cookie_value.encode(), self.browser_binding.encode()
        )


class LoginStateStore(Protocol):
    """Storage of pending logins; ``take`` must be atomic."""

    def put(self, login: LoginState) -> None:
        """Remember a new pending login."""

    def take(self, state: str, now: float) -> LoginState | None:
        """Remove and return the login for ``state`` if it exists and has not expired."""

    def purge_expired(self, now: float) -> int:
        """Drop expired logins; returns how many were dropped."""


class TooManyPendingLoginsError(Exception):
    """The store is full: refuse new logins rather than grow without bound."""


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
                raise TooManyPendingLoginsError("too many logins in progress; try again later")
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
