"""Agent inventory reports: staleness and change detection, clock passed in."""

from __future__ import annotations

import hashlib
import json
from typing import Any

DEFAULT_STALE_AFTER_SECONDS = 300.0


def is_stale(last_sync_us: int, now_us: int, stale_after_seconds: float) -> bool:
    """Silent for longer than the threshold."""
    return now_us - last_sync_us > stale_after_seconds * 1e6


def state_view(status: dict[str, Any], now_us: int, stale_after_seconds: float) -> dict[str, Any]:
    """The cluster's ``state`` as read: the reported state plus ``stale`` at ``now_us``
    (only for states written by a report, which carry their receive time)."""
    state = dict(status["state"])
    if "syncTimeUs" in status:
        state["stale"] = is_stale(int(status["syncTimeUs"]), now_us, stale_after_seconds)
    return state


def digest(namespaces: list[dict[str, Any]], state: dict[str, Any]) -> str:
    """Content hash of a report (without its time): equal reports are heartbeats."""
    body = json.dumps({"n": namespaces, "s": state}, separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()
