"""Where a user may be sent after login (the ``redirectUri`` query parameter).

An unchecked post-login redirect is an open redirector: a phishing link
through our real login page that ends on the attacker's site. Allowed are
relative paths on our own origin, loopback URLs (``meshctl login`` listens
on ``127.0.0.1`` for the browser flow), and the origins the operator lists.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def is_safe_return_to(value: str, allowed_origins: Iterable[str] = ()) -> bool:
    """True when ``value`` may be used as the post-login destination."""
    if not value or any(ch in value for ch in "\r\n\t\\") or len(value) > 2048:
        return False
    if value.startswith("/"):
        return not value.startswith("//")
    parts = urlsplit(value)
    if parts.scheme not in {"http", "https"} or not parts.hostname or parts.username:
        return False
    if parts.scheme == "http" and parts.hostname in _LOOPBACK_HOSTS:
        return True
    return origin_of(value) in {origin_of(o) for o in allowed_origins}
