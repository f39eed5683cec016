"""A circuit breaker, so a Redis outage costs one timeout, not one per request.

Without it every call would wait the full store timeout while Redis is down,
which at a few hundred requests per second means Envoy sees the timeout on
every request and the service piles up work. Once ``failure_threshold``
consecutive calls have failed over at least ``min_streak_seconds``, the
breaker opens and calls fail at once for ``open_seconds``; then one trial call
is let through (half-open). Its success closes the breaker, its failure
reopens it. Pure logic: the clock is passed in.

Why the streak duration: a process descheduled for a few milliseconds on a
busy node makes several in-flight calls time out together. Counting only
consecutive failures would turn that blip into a whole open period of
refused calls; requiring the failures to persist tells an outage from a blip.
"""

from __future__ import annotations

import enum


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """Consecutive-failure breaker with a single half-open trial."""

    def __init__(
        self,
        *,
        failure_threshold: int = 3,
        open_seconds: float = 1.0,
        min_streak_seconds: float = 0.25,
    ) -> None:
        if failure_threshold < 1:
            raise ValueError("failure_threshold must be at least 1")
        self._threshold = failure_threshold
        self._open_seconds = open_seconds
        self._min_streak = min_streak_seconds
        self._failures = 0
        self._streak_start = 0.0
        self._state = BreakerState.CLOSED
        self._open_until = 0.0
        self._trial_in_flight = False
        #: True while CLOSED: callers test it before reading a clock for allow().
        self.closed = True

    @property
    def state(self) -> BreakerState:
        return self._state

    def allow(self, now: float) -> bool:
        """Whether a call may go to the store now."""
        if self._state is BreakerState.CLOSED:
            return True
        if self._state is BreakerState.OPEN and now >= self._open_until:
            self._state = BreakerState.HALF_OPEN
            self._trial_in_flight = False
        if self._state is BreakerState.HALF_OPEN and not self._trial_in_flight:
            self._trial_in_flight = True
            return True
        return False

    def record_success(self) -> None:
        if self.closed and not self._failures:
            return  # the usual call: nothing to change
        self._failures = 0
        self._state = BreakerState.CLOSED
        self.closed = True
        self._trial_in_flight = False

    def record_failure(self, now: float) -> bool:
        """Count a failed call; True when this failure opened the breaker
        (from closed, or a failed half-open trial), so the caller can act once
        per opening, e.g. drop its connections."""
        if self._failures == 0:
            self._streak_start = now
        self._failures += 1
        was_open = self._state is BreakerState.OPEN
        if self._state is BreakerState.HALF_OPEN or (
            self._failures >= self._threshold and now - self._streak_start >= self._min_streak
        ):
            self._state = BreakerState.OPEN
            self.closed = False
            self._open_until = now + self._open_seconds
            self._trial_in_flight = False
        return not was_open and self._state is BreakerState.OPEN
