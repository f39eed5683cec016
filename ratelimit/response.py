"""Pure response building: a plan + the store's outcome → RateLimitResponse.

Every limited descriptor's status carries ``current_limit``,
``limit_remaining`` and ``duration_until_reset``, so Envoy's own
``enable_x_ratelimit_headers`` computes the same headers we add ourselves.
Descriptors without a limit get a bare OK (as in the reference); ``unlimited``
ones get OK with ``limit_remaining`` = 2^32-1 and no current_limit.
"""

from __future__ import annotations

import math
import struct
from typing import NamedTuple

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
_PACK2, _PACK3, _PACK4, _PACK5 = (struct.Struct(f"{n}B").pack for n in (2, 3, 4, 5))


def _varint(value: int) -> bytes:
    """A protobuf varint; unrolled up to 5 bytes (every uint32), the loop beyond.

    The bytes are packed by a prebuilt ``struct`` (about half the CPU of
    ``bytes((...))`` from a tuple): a limit_remaining is one per status."""
    if value < 0x80:
        return _SMALL_VARINTS[value]
    if value < 0x4000:
        return _PACK2((value & 0x7F) | 0x80, value >> 7)
    if value < 0x200000:
        return _PACK3((value & 0x7F) | 0x80, ((value >> 7) & 0x7F) | 0x80, value >> 14)
    if value < 0x10000000:
        return _PACK4(
            (value & 0x7F) | 0x80,
            ((value >> 7) & 0x7F) | 0x80,
            ((value >> 14) & 0x7F) | 0x80,
            value >> 21,
        )
    if value < 0x800000000:
        return _PACK5(
            (value & 0x7F) | 0x80,
            ((value >> 7) & 0x7F) | 0x80,
            ((value >> 14) & 0x7F) | 0x80,
            ((value >> 21) & 0x7F) | 0x80,
            value >> 28,
        )
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


def _current_limit(limit: RateLimit) -> bytes:
    """The encoded ``current_limit`` field of a limit."""
    payload = b""
    if limit.requests_per_unit:
        payload += b"\x08" + _varint(limit.requests_per_unit)
    if limit.proto_unit:
        payload += b"\x10" + _varint(limit.proto_unit)
    if limit.name:
        payload += _field(b"\x1a", limit.name.encode())
    return _field(b"\x12", payload)


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


class _Limited(NamedTuple):
    """What a limited descriptor's status needs, fixed for its plan."""

    bucket: int  # index in the plan's buckets (and the outcome's counts and fits)
    bucket_limit: int
    shadow: bool
    ok: bytes  # the encoded code OK and current_limit
    over: bytes  # the encoded code OVER_LIMIT and current_limit
    window_end: int
    window_seconds: int
    slot: int  # index among the limited descriptors (the header values, the resets)


class _Template:
    """A plan's response, but what depends on the outcome and the clock.

    ``statuses`` holds the encoded status of each descriptor without a
    bucket, and a :class:`_Limited` for the others. The ``x-ratelimit-limit``
    header is the closest descriptor's limit, then every limit of the
    request (``listed``, fixed for the plan); only the header sent is
    built, and kept while the closest limit stays the same: one header per
    limited descriptor, each listing them all, would hold memory quadratic
    in the descriptors. The resets (and their encoded durations) depend on
    the clock only through its whole second, the windows being whole
    seconds, so they are kept for the second they were computed in.
    """

    __slots__ = (
        "durations",
        "headers",
        "limit_header",
        "limit_header_of",
        "limits",
        "listed",
        "names",
        "over_header",
        "remaining_heads",
        "reset_headers",
        "resets",
        "second",
        "statuses",
    )

    def __init__(
        self,
        statuses: tuple[bytes | _Limited, ...],
        limits: tuple[int, ...],
        headers: HeaderNames | None,
        listed: bytes,
    ) -> None:
        self.statuses = statuses
        self.limits = limits  # requests_per_unit of each limited descriptor, by slot
        self.headers = headers  # the header names it was built for (None: no headers)
        self.listed = listed  # ", <limit>;w=<window>[;name=...]" for every limit
        self.limit_header = b""  # the last x-ratelimit-limit header built...
        self.limit_header_of = -1  # ...and the closest limit it was built for
        self.names = names = None if headers is None else _names(headers)
        # The x-ratelimit-remaining entry up to its value, by the value's length
        # (a uint64 has at most 20 digits), and the x-proxy-ratelimited one.
        self.remaining_heads = () if names is None else _heads(names[1], 20)
        self.over_header = b"" if names is None else _header(names[3], b"true")
        self.second = -1
        self.resets: list[int] = []
        self.durations: list[bytes] = []
        self.reset_headers: list[bytes] = []  # x-ratelimit-reset of each slot, this second

    def tick(self, now: float) -> None:
        """The resets of ``now``'s second: Window.reset_after(now), whole
        seconds until each window turns, rounded up (with a whole-second end,
        ``ceil(end - now)`` is the same for every ``now`` of one second)."""
        self.second = math.floor(now)
        self.resets = [
            max(1, min(s.window_seconds, math.ceil(s.window_end - now)))
            for s in self.statuses
            if isinstance(s, _Limited)
        ]
        self.durations = [_duration(reset) for reset in self.resets]
        if self.names is not None:
            self.reset_headers = [_header(self.names[2], b"%d" % r) for r in self.resets]

    def build_limit_header(self, limit: int) -> None:
        """The x-ratelimit-limit header when the closest descriptor's limit is ``limit``."""
        assert self.names is not None
        self.limit_header = _header(self.names[0], b"%d" % limit + self.listed)
        self.limit_header_of = limit


def _heads(name: bytes, longest: int) -> tuple[bytes, ...]:
    """What :func:`_header` puts before a value of each length up to ``longest``."""
    return tuple(_header(name, b"0" * length)[: -length or None] for length in range(longest + 1))


def _names(headers: HeaderNames) -> tuple[bytes, bytes, bytes, bytes]:
    """The encoded header-name fields: limit, remaining, reset, ratelimited."""
    return (
        _field(b"\x0a", headers.limit.encode()),
        _field(b"\x0a", headers.remaining.encode()),
        _field(b"\x0a", headers.reset.encode()),
        _field(b"\x0a", headers.ratelimited.encode()),
    )


def _template(plan: Plan, headers: HeaderNames | None) -> _Template:
    statuses: list[bytes | _Limited] = []
    limits: list[RateLimit] = []
    for desc in plan.descriptors:
        limit = desc.limit
        if limit is None:
            statuses.append(_STATUS_BARE)
        elif desc.bucket is None:  # unlimited
            statuses.append(_STATUS_UNLIMITED)
        else:
            bucket = plan.buckets[desc.bucket]
            current = _current_limit(limit)
            # The reset is when the bucket is full again with no more traffic:
            # a fixed window's end; a sliding window's count is only gone
            # once the next window has passed too.
            reset_at, longest = bucket.window.end, bucket.window.seconds
            if bucket.prev_key:
                reset_at, longest = bucket.expires, 2 * bucket.window.seconds
            statuses.append(
                _Limited(
                    desc.bucket,
                    bucket.limit,
                    limit.shadow_mode,
                    _CODE_OK + current,
                    _CODE_OVER + current,
                    reset_at,
                    longest,
                    len(limits),
                )
            )
            limits.append(limit)
    listed = b""
    if headers is not None:
        listed = "".join(
            f", {limit.requests_per_unit};w={limit.window_seconds}"
            + (f';name="{limit.name}"' if limit.name else "")
            for limit in limits
        ).encode()
    return _Template(
        tuple(statuses), tuple(limit.requests_per_unit for limit in limits), headers, listed
    )


# A plan's template is built on its first response and kept in the plan's
# memo, so it lives as long as the plan is cached (a cached plan answers every
# request of its window) and counts towards the plan cache's byte bound.
_TEMPLATE = object()  # the memo key


def encode_response(
    plan: Plan,
    outcome: Outcome | None,
    now: float,
    *,
    headers: HeaderNames | None,
) -> bytes:
    """The serialized RateLimitResponse, as the gRPC adapter sends it.

    ``outcome`` is None when no descriptor needed the store; ``headers``
    None turns header emission off. What depends only on the plan is
    encoded once per plan, and what depends on the clock once a second
    (see :class:`_Template`). The loop is written for the hot path: a
    status's fields unpacked at once, no builtin ``max``/``isinstance`` calls
    (each costs several plain operations)."""
    template: _Template | None = plan.memo.get(_TEMPLATE)
    if template is None or template.headers is not headers:
        template = plan.memo[_TEMPLATE] = _template(plan, headers)
    if math.floor(now) != template.second:
        template.tick(now)
    durations = template.durations
    over = outcome is not None and not outcome.allowed
    parts = [_CODE_OVER if over else _CODE_OK]
    append = parts.append
    closest = -1  # the limited descriptor with the least remaining (the first on a tie)
    least = 0
    counts, fits = (outcome.counts, outcome.fits) if outcome is not None else ((), ())
    for status in template.statuses:
        if isinstance(status, bytes):
            append(status)
            continue
        index, bucket_limit, shadow, ok, over_head, _, _, slot = status
        remaining = bucket_limit - counts[index]
        head = ok if fits[index] or shadow else over_head
        duration = durations[slot]
        if remaining > 0:
            value = _varint(remaining)
            size = len(head) + len(value) + 1 + len(duration)
            framed = _SMALL_VARINTS[size] if size < 0x80 else _varint(size)
            append(b"".join((b"\x12", framed, head, b"\x18", value, duration)))
        else:
            remaining = 0
            size = len(head) + len(duration)
            framed = _SMALL_VARINTS[size] if size < 0x80 else _varint(size)
            append(b"".join((b"\x12", framed, head, duration)))
        if closest < 0 or remaining < least:
            closest, least = slot, remaining
    if template.names is not None:
        if closest >= 0:
            limit = template.limits[closest]
            if limit != template.limit_header_of:
                template.build_limit_header(limit)
            append(template.limit_header)
            value = b"%d" % least
            append(template.remaining_heads[len(value)] + value)
            append(template.reset_headers[closest])
        if over:
            append(template.over_header)
    return b"".join(parts)


def _header(name: bytes, value: bytes) -> bytes:
    """One RateLimitResponse.response_headers_to_add entry; ``name`` already encoded."""
    size = len(value)
    entry = name + b"\x12" + (_SMALL_VARINTS[size] if size < 0x80 else _varint(size)) + value
    size = len(entry)
    return b"\x1a" + (_SMALL_VARINTS[size] if size < 0x80 else _varint(size)) + entry


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
