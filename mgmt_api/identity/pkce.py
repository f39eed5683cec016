"""PKCE (RFC 7636) with the S256 method, and the random values of a login.

``plain`` is never offered: it protects nothing against an attacker who can
read the authorization request, which is the threat PKCE exists for.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets

# 32 random bytes give a 43-character verifier, the RFC's minimum length,
# with 256 bits of entropy.
_VERIFIER_BYTES = 32


def new_random_token(nbytes: int = 32) -> str:
    """An unguessable URL-safe value, for ``state``, ``nonce`` and verifiers."""
    return secrets.token_urlsafe(nbytes)


def new_code_verifier() -> str:
    """A fresh ``code_verifier`` (43 characters of the unreserved alphabet)."""
    return new_random_token(_VERIFIER_BYTES)


def code_challenge_s256(verifier: str) -> str:
    """``BASE64URL(SHA256(ASCII(code_verifier)))`` without padding."""
    if not 43 <= len(verifier) <= 128:
        raise ValueError("a code_verifier has 43 to 128 characters")
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


_S256_CHALLENGE = re.compile(r"^[A-Za-z0-9_-]{43}$")


def is_s256_challenge(value: str) -> bool:
    """True for a well-formed S256 ``code_challenge``: 43 base64url characters (32 bytes)."""
    return bool(_S256_CHALLENGE.fullmatch(value))
