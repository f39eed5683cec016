"""The console's session cookie and CSRF tokens (pure: no I/O, the clock is an argument).

* The session cookie holds the platform session token that ``POST
  /v2/auth/token`` (Basic) or ``POST /v2/oidc/token`` (OIDC) issued. The
  console never decides who the user is: every page passes that token as a
  bearer to the ``/v2`` API, which verifies it (signature, expiry, that the
  principal still exists) and applies RBAC. The cookie is ``HttpOnly`` (no
  script can read it), ``SameSite=Lax`` (not sent on cross-site POSTs; Lax
  rather than Strict so the redirect back from the identity provider keeps
  the session), scoped to ``/ui/`` (the ``/v2`` API never receives it, so it
  is no ambient credential there) and ``Secure`` unless the console is
  served over plain HTTP on loopback (``scripts/run``). Secure cookies take
  the ``__Secure-`` name prefix, which browsers refuse to set without TLS.
* CSRF: every state-changing request carries a token that is an HMAC of the
  session token under a key derived from the server's signing secret. It is
  bound to the session (a token from another session fails), needs no
  server-side storage, and is the same on every replica. Before a session
  exists (the login form), a random nonce in a short-lived cookie must equal
  the form's field (double submit), so a forged login is refused too.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

from meshplane.netaddr import is_loopback_host

COOKIE_PATH = "/ui/"
SESSION_NAME = "meshplane-console"
LOGIN_NONCE_NAME = "meshplane-console-login"
OIDC_NAME = "meshplane-console-oidc"
CSRF_FIELD = "_csrf"
CSRF_HEADER = "x-csrf-token"
LOGIN_NONCE_TTL = 600


@dataclass(frozen=True)
class CookiePolicy:
    """How this request's cookies are set: ``Secure`` (and the name prefix) or not."""

    secure: bool

    def name(self, base: str) -> str:
        return f"__Secure-{base}" if self.secure else base


def cookie_policy(scheme: str, server_host: str, public_url: str | None) -> CookiePolicy:
    """``Secure`` everywhere but plain HTTP on a loopback listener.

    A public URL in https means TLS ends in front of us (a proxy): the
    browser sees https, so the cookie must be Secure even though the request
    we see is http.
    """
    if public_url is not None and public_url.lower().startswith("https://"):
        return CookiePolicy(secure=True)
    return CookiePolicy(secure=not (scheme == "http" and is_loopback_host(server_host)))


def csrf_key(signing_secret: str) -> bytes:
    """The CSRF HMAC key, derived so it is never the token-signing key itself."""
    return hmac.new(signing_secret.encode(), b"meshplane-console-csrf", hashlib.sha256).digest()


def csrf_token(key: bytes, session_token: str) -> str:
    digest = hmac.new(key, b"csrf|" + session_token.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def csrf_ok(key: bytes, session_token: str, presented: str | None) -> bool:
    """Constant-time check of a presented token against the session's."""
    if not presented or not session_token:
        return False
    return hmac.compare_digest(csrf_token(key, session_token), presented)


def new_nonce() -> str:
    return secrets.token_urlsafe(32)


def nonce_ok(cookie: str | None, presented: str | None) -> bool:
    """The login form's double submit: the field equals the cookie."""
    if not cookie or not presented:
        return False
    return hmac.compare_digest(cookie, presented)


def safe_next(value: str | None) -> str:
    """Where to go after login: a path inside the console, never another site."""
    if not value or not value.startswith(COOKIE_PATH) or value.startswith("//"):
        return COOKIE_PATH
    if any(c in value for c in "\\\r\n") or "://" in value:
        return COOKIE_PATH
    return value
