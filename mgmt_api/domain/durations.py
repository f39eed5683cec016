"""Durations in the protobuf JSON form (``"3600s"``), also accepting ``1h30m``."""

from __future__ import annotations

import re

from mgmt_api.errors import invalid

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
MAX_SECONDS = 365 * 24 * 3600.0


def parse_duration(value: str, field: str) -> float:
    """Seconds in ``value``; 400 naming ``field`` when malformed or not positive."""
    try:
        return duration_seconds(value)
    except ValueError as exc:
        raise invalid(field, str(exc)) from None


def duration_seconds(value: str) -> float:
    """Seconds in ``value`` (``3600s``, ``1h30m``, ``0.5s``, ``250ms``), positive and at
    most a year; ValueError saying why not. The one duration syntax of the management
    plane: API fields, environment settings and the install config."""
    text = value.strip()
    pos = 0
    total = 0.0
    if not text:
        raise ValueError("must be a duration such as '3600s' or '1h'")
    while pos < len(text):
        m = _PART.match(text, pos)
        if not m:
            raise ValueError(f"{value!r} is not a duration such as '3600s' or '1h'")
        total += float(m.group(1)) * _UNIT[m.group(2)]
        pos = m.end()
    if total <= 0 or total > MAX_SECONDS:
        raise ValueError("must be positive and at most one year")
    return total


def format_duration(seconds: float) -> str:
    """Protobuf JSON form: ``"3600s"`` (fractions kept when present)."""
    if float(seconds).is_integer():
        return f"{int(seconds)}s"
    return f"{seconds:.3f}".rstrip("0") + "s"


def shortest_duration(seconds: float) -> str:
    """Whole ``seconds`` in the largest unit :func:`duration_seconds` reads that divides
    them (``720h``, ``5m``, ``10s``): how an error states a bound the caller can type."""
    for unit in ("h", "m", "s"):
        size = _UNIT[unit]
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return format_duration(seconds)
