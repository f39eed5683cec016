"""Where a user may be sent after login (the ``redirectUri`` query parameter).

An unchecked post-login redirect is an open redirector: a phishing link
through our real login page that ends on the attacker's site. Allowed are
relative paths on our own origin, the origins the operator lists, and the
loopback redirect of a native client (RFC 8252 section 7.3: ``meshctl login``
listens on ``127.0.0.1``).

Loopback targets must be literal IP addresses, ``http://127.0.0.1:PORT/...``
or ``http://[::1]:PORT/...``, as RFC 8252 section 8.3 recommends: the name
``localhost`` can be resolved elsewhere (a hosts file, a resolver that
answers it) and may reach another interface than the one the client
listens on. Whatever the target, no session token is ever put into it: the
server sends a one-time code there that only the client holding the PKCE
verifier can redeem (``login_code``).
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

LOOPBACK_IPS = frozenset({"127.0.0.1", "::1"})


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def is_loopback_return_to(value: str) -> bool:
    """``http://127.0.0.1[:port]/...`` or ``http://[::1][:port]/...``, literally."""
    parts = urlsplit(value)
    if parts.scheme != "http" or parts.username is not None or parts.password is not None:
        return False
    host = parts.netloc.rsplit("@", 1)[-1]
    literal = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    return literal in {"127.0.0.1", "[::1]"} and parts.hostname in LOOPBACK_IPS


def is_safe_return_to(value: str, allowed_origins: Iterable[str] = ()) -> bool:
    """True when ``value`` may be used as the post-login destination."""
    if not value or any(ch in value for ch in "\r\n\t\\") or len(value) > 2048:
        return False
    if value.startswith("/"):
        return not value.startswith("//")
    parts = urlsplit(value)
    if parts.scheme not in {"http", "https"} or not parts.hostname or parts.username:
        return False
    if parts.scheme == "http":
        return is_loopback_return_to(value)
    return origin_of(value) in {origin_of(o) for o in allowed_origins}
