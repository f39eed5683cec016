"""The W3C ``traceparent`` header (Trace Context, level 1): the one parser.

Pure: no OpenTelemetry import, so the decision log and the tracing gate
(:mod:`meshplane.tracing`) share it without the SDK. Version ``ff`` and
all-zero ids are invalid; a future version may carry more fields after the
four known ones, version ``00`` may not.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16
#: Longer than any valid header needs; a longer value is refused unparsed.
MAX_TRACEPARENT = 512


class TraceParent(NamedTuple):
    """What a valid header says: the trace id (32 hex digits) and the sampled flag."""

    trace_id: str
    sampled: bool


def parse(value: str | None) -> TraceParent | None:
    """The header's trace id and sampled flag, or None when absent or invalid."""
    if not value or len(value) > MAX_TRACEPARENT:
        return None
    match = _TRACEPARENT.match(value.strip())
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    if version == "00" and rest:
        return None
    return TraceParent(trace_id, bool(int(flags, 16) & 1))
