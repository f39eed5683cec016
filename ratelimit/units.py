"""Rate-limit units: their names, window lengths and proto enum values.

Windows follow envoyproxy/ratelimit (``UnitToDivider``): a month is 30 days and
a year 365 days, and every window is an epoch-aligned multiple of its length,
not a calendar period. Keeping that exact lets operators move their configs
over without their limits changing meaning.
"""

from __future__ import annotations

from types import MappingProxyType

from envoy.service.ratelimit.v3 import rls_pb2

_Unit = rls_pb2.RateLimitResponse.RateLimit.Unit

#: Window length in seconds per unit name (upper case, as in the proto enum).
WINDOW_SECONDS: MappingProxyType[str, int] = MappingProxyType(
    {
        "SECOND": 1,
        "MINUTE": 60,
        "HOUR": 3600,
        "DAY": 86400,
        "WEEK": 7 * 86400,
        "MONTH": 30 * 86400,
        "YEAR": 365 * 86400,
    }
)

#: The RateLimitResponse.RateLimit.Unit enum value per unit name.
PROTO_UNIT: MappingProxyType[str, int] = MappingProxyType(
    {name: int(_Unit.Value(name)) for name in WINDOW_SECONDS}
)

#: Unit name per proto enum value, for limits sent by Envoy (RateLimitOverride).
UNIT_BY_PROTO: MappingProxyType[int, str] = MappingProxyType(
    {value: name for name, value in PROTO_UNIT.items()}
)
