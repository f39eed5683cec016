"""Pure: the ``dynamic_metadata`` of a RateLimitResponse, as envoyproxy/ratelimit writes it.

With ``responseDynamicMetadata`` on (the reference's ``RESPONSE_DYNAMIC_METADATA``),
the response carries a ``google.protobuf.Struct`` that Envoy's ratelimit
filter publishes as dynamic metadata in its namespace
(``envoy.filters.http.ratelimit``), for later filters, routes and access logs.
Its shape is the reference's (``ratelimitToMetadata`` in its
``src/service/ratelimit.go``):

- ``domain``: the request's domain;
- ``descriptors``: one struct per request descriptor, with ``entries`` (a list
  of ``"key=value"`` strings), ``limit`` (only for a limit sent by Envoy: its
  text form) and ``hitsAddend`` (only when the descriptor sets one);
- ``hitsAddend``: the request's own, only when not 0;
- ``metadata``: the ``metadata`` of the config descriptors whose status is OK
  (the descriptors that *passed*), merged in request order; only when some
  passed descriptor has one.

Merging is the reference's ``mergeMetadata``: a key already present keeps its
value unless both values are mappings, which are merged the same way.

The Struct is protobuf's own (``struct_pb2``), appended to the response that
``ratelimit.response`` writes in wire format; tests read it back with the
official protos.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envoy.service.ratelimit.v3 import rls_pb2
from google.protobuf import struct_pb2

from ratelimit.plan import Plan
from ratelimit.response import _field
from ratelimit.store import Outcome
from ratelimit.units import UNIT_BY_PROTO


def merge(dest: dict[str, Any], src: Mapping[str, Any]) -> None:
    """The reference's ``mergeMetadata``: the first value of a key wins, but
    two mappings under one key are merged (recursively)."""
    for key, value in src.items():
        present = dest.get(key, _ABSENT)
        if present is _ABSENT:
            dest[key] = _copy(value)
        elif isinstance(present, dict) and isinstance(value, Mapping):
            merge(present, value)


_ABSENT = object()


def _copy(value: Any) -> Any:
    """A mapping copied, so merging into it never changes the config's."""
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    return value


def passed_metadata(plan: Plan, outcome: Outcome | None) -> dict[str, Any]:
    """The merged ``metadata`` of the limits whose descriptor passed (status OK).

    Unlimited descriptors do not take part (the reference drops their limit
    before this step); a descriptor without a limit passes but has none.
    """
    merged: dict[str, Any] = {}
    for desc in plan.descriptors:
        limit = desc.limit
        if limit is None or limit.metadata is None or desc.bucket is None:
            continue
        fits = outcome is not None and outcome.fits[desc.bucket]
        if fits or limit.shadow_mode:
            merge(merged, limit.metadata)
    return merged


def encode_field(plan: Plan, outcome: Outcome | None, raw_request: bytes) -> bytes:
    """RateLimitResponse field 6 (``dynamic_metadata``), encoded.

    The request is read again for its entries (a plan keeps only what the
    decision needs); this runs only when the setting is on.
    """
    request = rls_pb2.RateLimitRequest.FromString(raw_request)
    top: dict[str, Any] = {
        "domain": request.domain,
        "descriptors": [_descriptor(d) for d in request.descriptors],
    }
    if request.hits_addend:
        top["hitsAddend"] = float(request.hits_addend)
    metadata = passed_metadata(plan, outcome)
    if metadata:
        top["metadata"] = metadata
    struct = struct_pb2.Struct()
    struct.update(top)  # numbers become doubles, as in the reference's Struct
    return _field(b"\x32", struct.SerializeToString())


def _descriptor(descriptor: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"entries": [f"{e.key}={e.value}" for e in descriptor.entries]}
    if descriptor.HasField("limit"):
        out["limit"] = _limit_text(descriptor.limit)
    if descriptor.HasField("hits_addend"):
        out["hitsAddend"] = float(descriptor.hits_addend.value)
    return out


def _limit_text(limit: Any) -> str:
    """The override's text form as Go's protobuf ``String()`` writes it
    (``requests_per_unit:10 unit:MINUTE``, zero fields left out), without
    the random extra space Go adds to keep it from being parsed."""
    parts = []
    if limit.requests_per_unit:
        parts.append(f"requests_per_unit:{limit.requests_per_unit}")
    if limit.unit:
        parts.append(f"unit:{UNIT_BY_PROTO.get(limit.unit, str(limit.unit))}")
    return " ".join(parts)
