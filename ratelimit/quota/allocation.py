"""Pure allocation: each gateway's recent demand → its token-bucket share of a global limit.

No I/O and no clock of its own: every function takes ``now`` (seconds), so
the rules are table-tested (tests/ratelimit/test_quota_allocation.py).

How a global limit of ``R`` requests a second is divided among the gateways
that report a bucket (docs/ratelimit.md, "Global limits as quotas"):

- **Demand** is what a gateway was asked for, allowed and denied together,
  per second since its previous report, smoothed (:func:`smoothed_demand`):
  a gateway held to a small share still shows what it wanted.
- **Shares** sum to ``R`` exactly (:func:`shares`). A floor of
  ``FLOOR_FRACTION * R`` is split equally among the active gateways, so none
  starves while it has demand and a quiet one can start again at once; the
  rest goes by max-min fairness on the demand above the floor (water-filling):
  a gateway that wants less than its fair part gets what it wants, the others
  share what is left equally. Headroom no one wants is split equally, so a
  gateway whose demand grows can use it before its next report.
- **Token buckets** (:func:`token_bucket`): Envoy reads ``fill_interval`` in
  whole seconds and refills continuously at ``tokens_per_fill /
  fill_interval``; the tokens are rounded down, so a bucket never refills
  faster than its share, over an interval long enough that the rounding
  costs at most a tenth of a token a second. ``max_tokens`` (the burst) is ``BURST_SECONDS`` of
  the share: Envoy starts a new bucket full whenever an assignment changes,
  so the burst is what each change can admit above the share.
- **Hysteresis** (:func:`needs_update`): an assignment shrinks as soon as
  its share does, so the sum stays within the limit, but grows only by more
  than ``CHANGE_TOLERANCE``, since each replacement costs one burst.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

#: The part of the limit split equally among active gateways whatever their demand.
FLOOR_FRACTION = 0.1
#: A bucket's burst, in seconds of its share (at least one token).
BURST_SECONDS = 0.5
#: How much a share may move before its assignment is replaced (relative).
CHANGE_TOLERANCE = 0.1
#: Weight of the newest report in the smoothed demand.
SMOOTHING = 0.5
#: Envoy's fill interval is whole seconds and its tokens whole: the interval is
#: long enough to hold ``PRECISION_TOKENS`` tokens (1 s from 100 a second, 10 s
#: from 1 a second), so rounding the tokens down loses at most 1/PRECISION_TOKENS
#: of a share (of at least 1 a second) rather than up to a whole token a second.
PRECISION_TOKENS = 10
#: A share below one token a second gets a longer interval, at most this long.
MAX_FILL_INTERVAL = 60
#: Seconds between a gateway's usage reports. Envoy's filter reports every 5 s
#: whatever its config says (it does not read ``reporting_interval``).
REPORT_INTERVAL = 5.0
#: The default assignment TTL and staleness (seconds): three reports, so one
#: lost report neither expires an assignment nor drops a gateway's share.
DEFAULT_TTL = 15


@dataclass(frozen=True, slots=True)
class Usage:
    """One gateway's view of one bucket, as the server last heard it."""

    demand: float  # requests per second, smoothed
    at: float  # when it was reported (server clock, seconds)


@dataclass(frozen=True, slots=True)
class TokenBucket:
    """An ``envoy.type.v3.TokenBucket`` assignment."""

    max_tokens: int
    tokens_per_fill: int
    fill_interval: int  # whole seconds

    @property
    def rate(self) -> float:
        """Tokens a second this bucket admits in the long run."""
        return self.tokens_per_fill / self.fill_interval


def smoothed_demand(previous: float | None, requests: int, elapsed: float) -> float:
    """Requests a second over ``elapsed`` seconds, averaged with the previous demand.

    The first report of a bucket (``previous`` None) or one without a usable
    interval is taken as it is: its rate is the best guess there is.
    """
    rate = requests / elapsed if elapsed > 0 else float(requests)
    if previous is None:
        return rate
    return SMOOTHING * rate + (1 - SMOOTHING) * previous


def active(usage: Mapping[str, Usage], now: float, stale_after: float) -> dict[str, float]:
    """member → demand, for the gateways heard within ``stale_after`` seconds."""
    return {member: u.demand for member, u in usage.items() if now - u.at <= stale_after}


def shares(limit: float, demands: Mapping[str, float]) -> dict[str, float]:
    """member → requests a second; the values sum to ``limit`` (see the module doc)."""
    if not demands or limit <= 0:
        return dict.fromkeys(demands, 0.0)
    count = len(demands)
    floor = FLOOR_FRACTION * limit / count
    extra = {m: max(d - floor, 0.0) for m, d in demands.items()}
    rest = limit - floor * count
    fill = _water_fill(rest, extra)
    spare = rest - sum(fill.values())
    return {m: floor + fill[m] + spare / count for m in demands}


def _water_fill(total: float, wants: Mapping[str, float]) -> dict[str, float]:
    """Max-min fair split of ``total``: the smallest wants first, each capped by the level."""
    out: dict[str, float] = {}
    left = total
    pending = sorted(wants.items(), key=lambda item: item[1])
    while pending:
        level = left / len(pending)
        member, want = pending[0]
        if want > level:
            for name, _ in pending:
                out[name] = level
            return out
        out[member] = want
        left -= want
        pending.pop(0)
    return out


def token_bucket(share: float) -> TokenBucket:
    """The bucket that admits at most ``share`` a second (one token at least).

    Envoy refills continuously at ``tokens_per_fill / fill_interval``; the
    interval only sets the rounding (see ``PRECISION_TOKENS``).
    """
    if share >= 10 * PRECISION_TOKENS:
        interval = 1
    elif share >= 1:
        interval = PRECISION_TOKENS
    elif share > 0:
        interval = min(MAX_FILL_INTERVAL, math.ceil(PRECISION_TOKENS / share))
    else:
        interval = MAX_FILL_INTERVAL
    tokens = max(1, math.floor(share * interval + 1e-9))
    burst = max(1, math.floor(share * BURST_SECONDS))
    return TokenBucket(max_tokens=burst, tokens_per_fill=tokens, fill_interval=interval)


def needs_update(current: TokenBucket | None, wanted: TokenBucket) -> bool:
    """Whether to replace ``current`` with ``wanted``: when there is none, when it
    must shrink (the sum of shares stays within the limit), and when it may
    grow by more than ``CHANGE_TOLERANCE`` (a small gain is not worth a burst)."""
    if current is None:
        return True
    if wanted.rate < current.rate:
        return True
    return wanted.rate - current.rate > CHANGE_TOLERANCE * current.rate


def over_admission_bound(limit: float, gateways: int, report_interval: float) -> float:
    """Requests a second above ``limit`` in the worst case (docs/ratelimit.md):
    every gateway's assignment replaced at every report, each replacement
    admitting one burst (``BURST_SECONDS`` of its share, one token at least)."""
    bursts = max(BURST_SECONDS * limit, float(gateways))
    return bursts / report_interval
