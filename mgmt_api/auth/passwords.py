"""Password hashing with Argon2id, plus a cache that avoids re-hashing per request.

Argon2 is deliberately slow (tens of ms), which would make every Basic-auth
request slow too. The cache remembers that (principal, SHA-256 of the
password) verified against a given stored hash; it is only trusted while the
stored hash is unchanged, so a password change or user deletion invalidates it
at once. Plain passwords are never kept.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

_hasher = PasswordHasher()
MIN_LENGTH = 8
MAX_LENGTH = 1024


def hash_password(password: str) -> str:
    return _hasher.hash(password)


class VerifiedCache:
    def __init__(self, max_entries: int = 4096) -> None:
        self._entries: OrderedDict[tuple[str, bytes], str] = OrderedDict()
        self._max = max_entries
        self._lock = threading.Lock()

    def verify(self, principal: str, password: str, stored_hash: str) -> bool:
        key = (principal, hashlib.sha256(password.encode()).digest())
        with self._lock:
            if self._entries.get(key) == stored_hash:
                self._entries.move_to_end(key)
                return True
        try:
            _hasher.verify(stored_hash, password)
        except (VerifyMismatchError, VerificationError, InvalidHashError):
            return False
        with self._lock:
            self._entries[key] = stored_hash
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)
        return True
