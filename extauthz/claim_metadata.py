"""Verified JWT claims published as Envoy dynamic metadata (per-identity rate limits).

A policy's ``claimsToMetadata`` names the claims the gateway's rate-limit
actions read (the management plane compiles the list from the
BackendTrafficPolicies whose rules select on ``jwtClaims``). The allow
decision carries them; the gRPC adapter puts them in the OK
``CheckResponse.dynamic_metadata``, which Envoy's ext_authz filter stores under
:data:`NAMESPACE` (a fixed name in Envoy, whatever the filter is called),
as ``{KEY: {claim: value}}``.

Why metadata and not a header (Envoy Gateway's claim-to-header): a client
can send any header, and on a route that no ext_authz covers (or if the
filter order were wrong) a header selector would count whatever the client
wrote. Dynamic metadata can only be set by a filter, so a descriptor built
from it is a verified claim or absent.

Published only on an allow: the decision is built after the signature,
``nbf``/``exp`` and the path claim passed, so a forged or expired token
publishes nothing (and is denied before the rate-limit filter runs).

Bounds: at most :data:`MAX_CLAIMS` names per policy, each at most
:data:`MAX_NAME_CHARS`; a value is a string, an integer or a boolean (others,
floats included, are not published: the rule then does not apply, as for an
absent claim); a value longer than :data:`MAX_VALUE_BYTES` is published as
``sha256:<hex>`` of its UTF-8 bytes, so each value still has its own bucket
while the descriptor, the Redis key and the cached decision stay bounded.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

NAMESPACE = "envoy.filters.http.ext_authz"
"""Where Envoy's HTTP ext_authz filter stores a CheckResponse's dynamic metadata."""

KEY = "meshplane.claims"
"""The field of that namespace holding ``{claim: value}``."""

MAX_CLAIMS = 8
MAX_NAME_CHARS = 64
MAX_VALUE_BYTES = 256
DIGEST_PREFIX = "sha256:"

#: Claim names: visible ASCII (``sub``, ``org``, ``https://example.com/tenant``).
NAME_PATTERN = re.compile(rf"[!-~]{{1,{MAX_NAME_CHARS}}}")

Published = tuple[tuple[str, str], ...]


def metadata_value(value: Any) -> str | None:
    """The descriptor value a claim publishes, or None when it publishes nothing."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        text = str(value)
    elif isinstance(value, str):
        text = value
    else:
        return None  # absent, null, floats (no one canonical text), objects, lists
    if not text:
        return None  # an empty descriptor value would be no value at all to Envoy
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_VALUE_BYTES:
        return DIGEST_PREFIX + hashlib.sha256(raw).hexdigest()
    return text


def publish(names: tuple[str, ...], claims: Mapping[str, Any]) -> Published:
    """``(name, value)`` for each named claim the verified token carries in a publishable form."""
    out: list[tuple[str, str]] = []
    for name in names:
        value = metadata_value(claims.get(name))
        if value is not None:
            out.append((name, value))
    return tuple(out)
