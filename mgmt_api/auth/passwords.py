"""Password hashing with Argon2id, plus a cache that avoids re-hashing per request.

Argon2 is deliberately slow (tens of ms), which would make every Basic-auth
request slow too. The cache remembers that (principal, SHA-256 of the
password) verified against a given stored hash; it is only trusted while the
stored hash is unchanged, so a password change or user deletion invalidates it
at once. Plain passwords are never kept.

A login name that has no password (no such user, or a user who signs in
through OIDC only) is verified against a dummy hash made with the same
parameters: every attempt that is not a cached success costs one Argon2
verification, so the time an answer takes does not tell which login names
exist.
"""

from __future__ import annotations

import functools
import hashlib
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

_hasher = PasswordHasher()
MIN_LENGTH = 8
MAX_LENGTH = 1024


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def argon2_verify(stored_hash: str, password: str) -> bool:
    """Whether ``password`` matches ``stored_hash`` (one full Argon2 run)."""
    try:
        return _hasher.verify(stored_hash, password)
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


@functools.cache
def dummy_hash() -> str:
    """A hash of a random password nobody knows, with the real parameters (made once)."""
    return _hasher.hash(secrets.token_urlsafe(32))


class VerifiedCache:
    """Password checks, remembering successes for the stored hash they were made against.

    ``verify_hash`` is the Argon2 verification (replaceable so that a test can
    count its calls).
    """

    def __init__(
        self,
        max_entries: int = 4096,
        verify_hash: Callable[[str, str], bool] = argon2_verify,
    ) -> None:
        self._entries: OrderedDict[tuple[str, bytes], str] = OrderedDict()
        self._max = max_entries
        self._lock = threading.Lock()
        self._verify_hash = verify_hash

    def verify(self, principal: str, password: str, stored_hash: str | None) -> bool:
        """Whether ``password`` is ``principal``'s; None = it has no password.

        Without a stored hash the dummy one is verified all the same, and
        the answer is False.
        """
        if stored_hash is None:
            self._verify_hash(dummy_hash(), password)
            return False
        key = (principal, hashlib.sha256(password.encode()).digest())
        with self._lock:
            if self._entries.get(key) == stored_hash:
                self._entries.move_to_end(key)
                return True
        if not self._verify_hash(stored_hash, password):
            return False
        with self._lock:
            self._entries[key] = stored_hash
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)
        return True
