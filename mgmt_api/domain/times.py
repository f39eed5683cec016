"""Timestamps as the API shows them: RFC 3339, UTC, microseconds.

The store keeps times as integer microseconds since the epoch (exact, and
comparable in SQL on both stores); every response renders them here.
"""

from __future__ import annotations

import datetime as dt


def rfc3339(us: int) -> str:
    return (
        dt.datetime.fromtimestamp(us / 1e6, tz=dt.UTC)
        .isoformat(timespec="microseconds")
        .replace("+00:00", "Z")
    )
