"""Pure header rendering: descriptor statuses → the x-ratelimit response headers.

The service emits the headers itself (in ``response_headers_to_add``) so the
gateway behaviour of spec 4.10 does not depend on how Envoy is configured, and
it renders them exactly as Envoy's ``enable_x_ratelimit_headers:
DRAFT_VERSION_03`` does from the same statuses (``ratelimit_headers.cc``):

- only descriptors with a limit count; with none, no headers at all;
- the "closest" bucket is the one with the least ``limit_remaining``, the
  first in request order on a tie;
- ``x-ratelimit-limit: <closest limit>, <limit>;w=<window>[;name="<name>"], ...``
  listing every limited descriptor in request order (the name only when the
  rule has one, as Envoy does; rules compiled from BackendTrafficPolicy have none);
- ``x-ratelimit-remaining`` and ``x-ratelimit-reset`` (whole seconds) of the
  closest bucket;
- ``x-proxy-ratelimited: true`` when the request is denied.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HeaderNames:
    """Configurable header names (lower case, as HTTP/2 requires)."""

    limit: str = "x-ratelimit-limit"
    remaining: str = "x-ratelimit-remaining"
    reset: str = "x-ratelimit-reset"
    ratelimited: str = "x-proxy-ratelimited"


@dataclass(frozen=True, slots=True)
class LimitView:
    """What the headers need from one limited descriptor's status."""

    requests_per_unit: int
    window_seconds: int
    remaining: int
    reset_seconds: int
    name: str | None = None


def render(
    limits: Sequence[LimitView], *, over_limit: bool, names: HeaderNames
) -> list[tuple[str, str]]:
    """The headers to add, in a stable order."""
    headers: list[tuple[str, str]] = []
    if limits:
        closest = limits[0]
        for view in limits[1:]:
            if view.remaining < closest.remaining:
                closest = view
        parts = [str(closest.requests_per_unit)]
        for view in limits:
            part = f"{view.requests_per_unit};w={view.window_seconds}"
            if view.name:
                part += f';name="{view.name}"'
            parts.append(part)
        headers += [
            (names.limit, ", ".join(parts)),
            (names.remaining, str(closest.remaining)),
            (names.reset, str(closest.reset_seconds)),
        ]
    if over_limit:
        headers.append((names.ratelimited, "true"))
    return headers
