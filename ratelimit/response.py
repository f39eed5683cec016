"""Pure response building: a plan + the store's outcome → RateLimitResponse.

Every limited descriptor's status carries ``current_limit``,
``limit_remaining`` and ``duration_until_reset``, so Envoy's own
``enable_x_ratelimit_headers`` computes the same headers we add ourselves.
Descriptors without a limit get a bare OK (as in the reference); ``unlimited``
ones get OK with ``limit_remaining`` = 2^32-1 and no current_limit.
"""

from __future__ import annotations

from envoy.service.ratelimit.v3 import rls_pb2

from ratelimit.headers import HeaderNames, LimitView, render
from ratelimit.plan import Plan
from ratelimit.store import Outcome

_Response = rls_pb2.RateLimitResponse
OK = _Response.OK
OVER_LIMIT = _Response.OVER_LIMIT
_MAX_UINT32 = 2**32 - 1


def build_response(
    plan: Plan,
    outcome: Outcome | None,
    now: float,
    *,
    headers: HeaderNames | None,
) -> rls_pb2.RateLimitResponse:
    """``outcome`` is None when no descriptor needed the store; ``headers``
    None turns header emission off."""
    response = _Response(overall_code=OK)
    views: list[LimitView] = []
    remaining = outcome.remaining(plan.buckets) if outcome is not None else ()
    for desc in plan.descriptors:
        status = response.statuses.add()
        status.code = OK
        limit = desc.limit
        if limit is None:
            continue
        if desc.bucket is None:  # unlimited
            status.limit_remaining = _MAX_UINT32
            continue
        assert outcome is not None
        bucket = plan.buckets[desc.bucket]
        if not outcome.fits[desc.bucket] and not limit.shadow_mode:
            status.code = OVER_LIMIT
        current = status.current_limit
        current.requests_per_unit = limit.requests_per_unit
        current.unit = limit.proto_unit
        if limit.name:
            current.name = limit.name
        status.limit_remaining = remaining[desc.bucket]
        reset = bucket.window.reset_after(now)
        status.duration_until_reset.seconds = reset
        views.append(
            LimitView(
                limit.requests_per_unit,
                limit.window_seconds,
                remaining[desc.bucket],
                reset,
                limit.name,
            )
        )
    if outcome is not None and not outcome.allowed:
        response.overall_code = OVER_LIMIT
    if headers is not None:
        add_headers(
            response, render(views, over_limit=response.overall_code == OVER_LIMIT, names=headers)
        )
    return response


def add_headers(response: rls_pb2.RateLimitResponse, headers: list[tuple[str, str]]) -> None:
    add = response.response_headers_to_add.add
    for name, value in headers:
        add(key=name, value=value)


def failure_response(
    plan: Plan, *, deny: bool, headers: HeaderNames | None
) -> rls_pb2.RateLimitResponse:
    """The answer when the store is down and ``failureMode`` is allow or deny.

    Limited descriptors get OVER_LIMIT (deny) or a bare OK (allow): without
    the store there is no remaining count to report, so no x-ratelimit-*
    headers either; a denial still carries ``x-proxy-ratelimited: true``.
    """
    code = OVER_LIMIT if deny else OK
    response = _Response(overall_code=code)
    for desc in plan.descriptors:
        status = response.statuses.add()
        status.code = code if desc.bucket is not None else OK
        if desc.limit is not None and desc.bucket is None:
            status.limit_remaining = _MAX_UINT32
    if headers is not None and deny:
        add_headers(response, render([], over_limit=True, names=headers))
    return response
