"""Paging and label selection for list endpoints (pure).

Pages are keyset pages over the FQN order: the token is the last FQN returned,
base64url-encoded, so pages stay stable while objects are added or removed
and no offset scan is ever needed.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping

from mgmt_api.errors import invalid

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


def encode_token(last_fqn: str) -> str:
    return base64.urlsafe_b64encode(last_fqn.encode()).decode().rstrip("=")


def decode_token(token: str) -> str:
    if not token:
        return ""
    try:
        padded = token + "=" * (-len(token) % 4)
        decoded = base64.b64decode(padded.encode("ascii"), altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeError, ValueError) as exc:
        raise invalid("pageToken", "is not a token this server issued") from exc
    if not decoded:
        raise invalid("pageToken", "is not a token this server issued")
    return decoded


def parse_selector(text: str) -> list[tuple[str, str | None]]:
    """``k1=v1,k2`` -> ``[("k1", "v1"), ("k2", None)]`` (a bare key means "has the label")."""
    out: list[tuple[str, str | None]] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if not key:
            raise invalid("labelSelector", f"{part!r} has no label key")
        out.append((key, value.strip() if sep else None))
    return out


def matches(labels: Mapping[str, str] | None, selector: list[tuple[str, str | None]]) -> bool:
    have = labels or {}
    for key, value in selector:
        if key not in have or (value is not None and have[key] != value):
            return False
    return True
