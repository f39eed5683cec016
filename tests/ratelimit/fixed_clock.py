"""A rate-limit app whose clock stands still, buildable in another process.

The transport tests run the service under a real supervisor (either server),
so the clock cannot be moved from the test; it stands at a fixed instant,
which makes every header (``x-ratelimit-reset`` included) exact.
``functools.partial(build_at, options, now)`` pickles by reference.
"""

from __future__ import annotations

from ratelimit.app import AppOptions, RateLimitApp


def build_at(options: AppOptions, now: float) -> RateLimitApp:
    return RateLimitApp(options, clock=lambda: now)
