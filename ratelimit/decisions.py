"""ratelimit's decision-log hook: a line for every over-limit and shadow-mode hit.

Kept apart from the decision so the hot path gains one branch: a request
within every limit is not touched. An over-limit (429) answer gets a line
and an ``x-decision-id`` response header (appended to the encoded response
as one more ``response_headers_to_add`` entry, so Envoy passes it to the
client with the 429); a shadow-mode hit, which Envoy lets through, gets a
line only.

This is ratelimit's one redaction point for decision lines: descriptor
values (user ids, API keys, addresses) are masked unless configured to be
shown; keys, the domain and the limit come from the request's shape and
the config, and are logged as they are.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence

from envoy.service.ratelimit.v3 import rls_pb2

from meshplane.decision_log import (
    DECISION_ID_HEADER,
    DecisionLog,
    DenialKind,
    clip,
    new_decision_id,
    rfc3339,
)
from ratelimit.plan import Plan
from ratelimit.store import Outcome

_HELD_OVERHEAD = 512  # a queued builder's own objects, roughly, for the byte bound
_HEADER_NAME = b"\x0a" + bytes([len(DECISION_ID_HEADER)]) + DECISION_ID_HEADER.encode()


def hits(plan: Plan, outcome: Outcome) -> list[tuple[int, bool]]:
    """``(descriptor index, shadow)`` of each descriptor over its limit (pure)."""
    found: list[tuple[int, bool]] = []
    for index, desc in enumerate(plan.descriptors):
        if desc.limit is None or desc.bucket is None or outcome.fits[desc.bucket]:
            continue
        found.append((index, desc.limit.shadow_mode))
    return found


def decision_line(
    plan: Plan,
    entries: Sequence[Sequence[tuple[str, str]]],
    found: Sequence[tuple[int, bool]],
    decision_id: str,
    now: float,
    *,
    over: bool,
    shown: Callable[[str], str],
) -> dict[str, object]:
    """The line (pure): domain, the hit descriptors' keys and shown values, their limits."""
    descriptors: list[dict[str, object]] = []
    for index, shadow in found:
        limit = plan.descriptors[index].limit
        assert limit is not None
        pairs = entries[index] if index < len(entries) else ()
        descriptors.append(
            {
                "entries": [{"key": clip(key), "value": shown(value)} for key, value in pairs],
                "limit": {
                    "requests_per_unit": limit.requests_per_unit,
                    "unit": limit.unit,
                    "rule": limit.rule_id,
                },
                "shadow": shadow,
            }
        )
    decision = _decision(over, found)
    return {
        "decision_id": decision_id,
        "time": rfc3339(now),
        "decision": decision,
        "kind": DenialKind.RATELIMIT.value,
        # The domain is the BackendTrafficPolicy's (CLUSTER/NAMESPACE/NAME).
        "policy": clip(plan.domain),
        "rule": _rule(plan, found),
        "reason": decision,
        "domain": clip(plan.domain),
        "descriptors": descriptors,
    }


def _rule(plan: Plan, found: Sequence[tuple[int, bool]]) -> str | None:
    """The rule of the first enforced hit (else of the first hit): the one that refused."""
    ordered = sorted(found, key=lambda hit: hit[1])  # enforced (shadow False) first
    for index, _shadow in ordered:
        limit = plan.descriptors[index].limit
        if limit is not None:
            return limit.rule_id
    return None


def _decision(over: bool, found: Sequence[tuple[int, bool]]) -> str:
    """``over_limit`` (a 429); else ``shadow`` when every hit is a shadow rule,
    and ``quota`` when a quota descriptor ran out but another still had quota."""
    if over:
        return "over_limit"
    return "shadow" if all(shadow for _, shadow in found) else "quota"


def request_entries(raw_request: bytes) -> list[list[tuple[str, str]]]:
    """The (key, value) pairs of each descriptor; read again only on a hit."""
    request = rls_pb2.RateLimitRequest.FromString(raw_request)
    return [[(e.key, e.value) for e in d.entries] for d in request.descriptors]


def header_entry(decision_id: str) -> bytes:
    """One encoded ``response_headers_to_add`` entry (field 3) carrying the id."""
    value = decision_id.encode()
    entry = _HEADER_NAME + b"\x12" + bytes([len(value)]) + value
    return b"\x1a" + bytes([len(entry)]) + entry


def _build(  # noqa: PLR0917 - a queued line's materials, in order
    plan: Plan,
    raw_request: bytes,
    found: Sequence[tuple[int, bool]],
    decision_id: str,
    now: float,
    over: bool,
    shown: Callable[[str], str],
) -> dict[str, object]:
    """The line of a queued hit (run by the writer thread)."""
    entries = request_entries(raw_request)
    return decision_line(plan, entries, found, decision_id, now, over=over, shown=shown)


class DecisionRecorder:
    """Logs over-limit and shadow hits; returns bytes to append to the response."""

    def __init__(self, log: DecisionLog, *, clock: Callable[[], float] = time.time) -> None:
        self._log = log
        self._settings = log.settings
        self._clock = clock

    def _shown(self, value: str) -> str:
        return self._settings.shown(value, self._settings.show_values)

    def record(self, plan: Plan, outcome: Outcome, raw_request: bytes) -> bytes:
        """Queue a line when a descriptor is over its limit; the header entry on a 429."""
        found = hits(plan, outcome)
        if not found:
            return b""
        decision_id = new_decision_id()
        over = not outcome.allowed
        # The request is parsed again and its values masked in the writer
        # thread, not here: a flood of 429s costs the hot path little.
        self._log.submit(
            functools.partial(
                _build, plan, raw_request, found, decision_id, self._clock(), over, self._shown
            ),
            _HELD_OVERHEAD + len(raw_request),
        )
        return header_entry(decision_id) if over else b""

    def close(self) -> None:
        self._log.close()
