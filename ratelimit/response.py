"""Pure response building: a plan + the store's outcome → RateLimitResponse.

Every limited descriptor's status carries ``current_limit``,
``limit_remaining`` and ``duration_until_reset``, so Envoy's own
``enable_x_ratelimit_headers`` computes the same headers we add ourselves.
Descriptors without a limit get a bare OK (as in the reference); ``unlimited``
ones get OK with ``limit_remaining`` = 2^32-1 and no current_limit.
"""

from __future__ import annotations

from collections.abc import Sequence

from envoy.service.ratelimit.v3 import rls_pb2

from ratelimit.config import RateLimit
from ratelimit.headers import HeaderNames, render
from ratelimit.plan import Plan
from ratelimit.store import Outcome

_Response = rls_pb2.RateLimitResponse
OK = _Response.OK
OVER_LIMIT = _Response.OVER_LIMIT
_MAX_UINT32 = 2**32 - 1


# The response is written in protobuf wire format and parsed once: about a
# third of the cost of setting a dozen fields one by one through the
# protobuf API, on every request. Field numbers are those of
# envoy/service/ratelimit/v3/rls.proto; tests compare the result with the
# same response built field by field.
_SMALL_VARINTS = tuple(bytes((i,)) for i in range(128))


def _varint(value: int) -> bytes:
    if value < 0x80:
        return _SMALL_VARINTS[value]
    if value < 0x4000:
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field."""
    return tag + _varint(len(payload)) + payload


_CODE_OK = b"\x08" + _varint(OK)  # DescriptorStatus.code / RateLimitResponse.overall_code
_CODE_OVER = b"\x08" + _varint(OVER_LIMIT)
_STATUS_BARE = _field(b"\x12", _CODE_OK)  # RateLimitResponse.statuses
_STATUS_UNLIMITED = _field(b"\x12", _CODE_OK + b"\x18" + _varint(_MAX_UINT32))
_CURRENT_LIMITS: dict[tuple[int, int, str | None], bytes] = {}
_MAX_CURRENT_LIMITS = 4096  # overrides sent by Envoy can carry any value: stay bounded


def _current_limit(limit: RateLimit) -> bytes:
    """The encoded ``current_limit`` field of a limit, built once."""
    key = (limit.requests_per_unit, limit.proto_unit, limit.name)
    encoded = _CURRENT_LIMITS.get(key)
    if encoded is None:
        if len(_CURRENT_LIMITS) >= _MAX_CURRENT_LIMITS:
            _CURRENT_LIMITS.clear()
        payload = b""
        if limit.requests_per_unit:
            payload += b"\x08" + _varint(limit.requests_per_unit)
        if key[1]:
            payload += b"\x10" + _varint(key[1])
        if limit.name:
            payload += _field(b"\x1a", limit.name.encode())
        encoded = _CURRENT_LIMITS[key] = _field(b"\x12", payload)
    return encoded


_DURATIONS: dict[int, bytes] = {}
_MAX_DURATIONS = 65536


def _duration(seconds: int) -> bytes:
    """The encoded ``duration_until_reset`` field (a Duration of whole seconds)."""
    encoded = _DURATIONS.get(seconds)
    if encoded is None:
        if len(_DURATIONS) >= _MAX_DURATIONS:
            _DURATIONS.clear()
        encoded = _DURATIONS[seconds] = _field(b"\x22", b"\x08" + _varint(seconds))
    return encoded


def encode_response(
    plan: Plan,
    outcome: Outcome | None,
    now: float,
    *,
    headers: HeaderNames | None,
) -> bytes:
    """The serialized RateLimitResponse, as the gRPC adapter sends it.

    ``outcome`` is None when no descriptor needed the store; ``headers``
    None turns header emission off."""
    over = outcome is not None and not outcome.allowed
    parts = [_CODE_OVER if over else _CODE_OK]
    append = parts.append
    views: list[tuple[RateLimit, int, int]] = []  # limit, remaining, reset
    buckets = plan.buckets
    for desc in plan.descriptors:
        limit = desc.limit
        if limit is None:
            append(_STATUS_BARE)
            continue
        index = desc.bucket
        if index is None:  # unlimited
            append(_STATUS_UNLIMITED)
            continue
        assert outcome is not None
        bucket = buckets[index]
        denied = not outcome.fits[index] and not limit.shadow_mode
        remaining = max(bucket.limit - outcome.counts[index], 0)
        reset = bucket.window.reset_after(now)
        status = (
            (_CODE_OVER if denied else _CODE_OK)
            + _current_limit(limit)
            + (b"\x18" + _varint(remaining) if remaining else b"")
            + _duration(reset)
        )
        size = len(status)
        append(b"\x12" + (_SMALL_VARINTS[size] if size < 0x80 else _varint(size)) + status)
        if headers is not None:
            views.append((limit, remaining, reset))
    if headers is not None:
        append(_encoded_headers(views, over, headers))
    return b"".join(parts)


def _header(name: bytes, value: bytes) -> bytes:
    """One RateLimitResponse.response_headers_to_add entry; ``name`` already encoded."""
    size = len(value)
    entry = name + b"\x12" + (_SMALL_VARINTS[size] if size < 0x80 else _varint(size)) + value
    size = len(entry)
    return b"\x1a" + (_SMALL_VARINTS[size] if size < 0x80 else _varint(size)) + entry


_NAME_FIELDS: dict[HeaderNames, tuple[bytes, bytes, bytes, bytes]] = {}
_LIMIT_LISTS: dict[tuple[tuple[int, int, str | None], ...], str] = {}
_MAX_LIMIT_LISTS = 4096


def _encoded_headers(
    views: Sequence[tuple[RateLimit, int, int]], over: bool, names: HeaderNames
) -> bytes:
    """What :func:`ratelimit.headers.render` gives, encoded (the hot path's version:
    the header names and the list of limits are encoded once)."""
    fields = _NAME_FIELDS.get(names)
    if fields is None:
        fields = _NAME_FIELDS[names] = (
            _field(b"\x0a", names.limit.encode()),
            _field(b"\x0a", names.remaining.encode()),
            _field(b"\x0a", names.reset.encode()),
            _field(b"\x0a", names.ratelimited.encode()),
        )
    out = b""
    if views:
        closest = views[0]
        for view in views[1:]:
            if view[1] < closest[1]:
                closest = view
        shape = tuple((v[0].requests_per_unit, v[0].window_seconds, v[0].name) for v in views)
        listed = _LIMIT_LISTS.get(shape)
        if listed is None:
            if len(_LIMIT_LISTS) >= _MAX_LIMIT_LISTS:
                _LIMIT_LISTS.clear()
            listed = _LIMIT_LISTS[shape] = "".join(
                f", {rpu};w={window}" + (f';name="{name}"' if name else "")
                for rpu, window, name in shape
            )
        out = (
            _header(fields[0], (str(closest[0].requests_per_unit) + listed).encode())
            + _header(fields[1], b"%d" % closest[1])
            + _header(fields[2], b"%d" % closest[2])
        )
    if over:
        out += _header(fields[3], b"true")
    return out


def add_headers(response: rls_pb2.RateLimitResponse, headers: list[tuple[str, str]]) -> None:
    add = response.response_headers_to_add.add
    for name, value in headers:
        add(key=name, value=value)


def can_deny(plan: Plan) -> bool:
    """Whether some limit of the request could deny it: a non-shadow bucket."""
    return any(
        d.limit is not None and d.bucket is not None and not d.limit.shadow_mode
        for d in plan.descriptors
    )


def failure_response(
    plan: Plan, now: float, *, deny: bool, headers: HeaderNames | None
) -> rls_pb2.RateLimitResponse:
    """The answer when the store is down and ``failureMode`` is allow or deny.

    Deny applies to the limits that could deny: a request is answered
    OVER_LIMIT only when it has a non-shadow limited descriptor (those get
    OVER_LIMIT); shadow rules never deny, with or without Redis, so a request
    that only hits shadow rules is answered OK. Limited descriptors carry
    ``current_limit`` and ``duration_until_reset``, which need no store; the
    remaining count is unknown, so ``limit_remaining`` is left out (0), and
    no x-ratelimit-* headers are added; a denial still carries
    ``x-proxy-ratelimited: true``.
    """
    buckets = plan.buckets
    deny = deny and can_deny(plan)
    response = _Response(overall_code=OVER_LIMIT if deny else OK)
    for desc in plan.descriptors:
        status = response.statuses.add()
        status.code = OK
        limit = desc.limit
        if limit is None:
            continue
        if desc.bucket is None:  # unlimited
            status.limit_remaining = _MAX_UINT32
            continue
        if deny and not limit.shadow_mode:
            status.code = OVER_LIMIT
        current = status.current_limit
        current.SetInParent()
        current.requests_per_unit = limit.requests_per_unit
        current.unit = limit.proto_unit
        if limit.name:
            current.name = limit.name
        status.duration_until_reset.seconds = buckets[desc.bucket].window.reset_after(now)
    if headers is not None and deny:
        add_headers(response, render([], over_limit=True, names=headers))
    return response
