"""Jittered exponential backoff for clients that keep a stream to the management plane.

Shared by the policy subscriber (:mod:`meshplane.distribution_client`) and
the cluster agent's tunnel, so both retry alike: 0.25 s doubling up to a cap,
each wait jittered ±20 % so a restarted management plane is not hit by every
client in the same instant, and the cap at once after a credentials refusal
(those do not fix themselves in a second).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

INITIAL_SECONDS = 0.25


@dataclass
class Backoff:
    maximum: float = 15.0
    initial: float = INITIAL_SECONDS
    jitter: Callable[[], float] = field(default=lambda: random.uniform(0.8, 1.2))  # noqa: S311
    _current: float = 0.0

    def __post_init__(self) -> None:
        self._current = self.initial

    def reset(self) -> None:
        """The connection worked: the next failure waits the initial time again."""
        self._current = self.initial

    def refused(self) -> None:
        """The server refused the credentials: wait the longest."""
        self._current = self.maximum

    def next_wait(self) -> float:
        """How long to wait now; the wait after it doubles (up to the maximum)."""
        wait = self._current * self.jitter()
        self._current = min(self._current * 2, self.maximum)
        return wait
