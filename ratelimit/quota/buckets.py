"""Pure: an RLQS ``BucketId`` → the rate-limit descriptor it stands for → its limit.

A quota bucket is named by the same descriptors the exact (ShouldRateLimit)
path uses, so one config file says what every limit is, whichever way it is
enforced. The bucket id's map carries them (the contract the compiler writes
to, :mod:`ratelimit.contract`):

- ``domain``: the config domain (absent: the stream's domain);
- ``<i>:<key>`` → value: the descriptor's entries, in the order of ``i``
  (``0:route``, ``1:rule-0-match-0``...); a map has no order of its own.

The limit is the one :func:`ratelimit.matching.match_descriptor` finds, as
a rate in requests a second (a window's requests spread over the window).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from ratelimit.config import RateLimitConfig
from ratelimit.matching import match_descriptor

#: The bucket-id key naming the config domain.
DOMAIN_KEY = "domain"
#: At most this many descriptor entries, and this long a key or value (bytes).
MAX_ENTRIES = 16
MAX_FIELD_BYTES = 512


class InvalidBucket(ValueError):
    """A bucket id this service cannot read; the message names what is wrong."""


@dataclass(frozen=True, slots=True)
class BucketLimit:
    """What a bucket is held to: ``rate`` requests a second, or no limit (None)."""

    domain: str
    rule: str | None
    rate: float | None


def entry_key(index: int, key: str) -> str:
    """The bucket-id key of a descriptor's ``index``-th entry."""
    return f"{index}:{key}"


def canonical(bucket_id: Mapping[str, str]) -> str:
    """A stable name of the bucket: the same on every gateway and every instance."""
    text = "\n".join(f"{k}={v}" for k, v in sorted(bucket_id.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def descriptor(
    bucket_id: Mapping[str, str], stream_domain: str
) -> tuple[str, list[tuple[str, str]]]:
    """(domain, entries) of a bucket id; :class:`InvalidBucket` when it is not one."""
    if len(bucket_id) > MAX_ENTRIES + 1:
        raise InvalidBucket(f"bucket_id has {len(bucket_id)} entries; at most {MAX_ENTRIES + 1}")
    domain = bucket_id.get(DOMAIN_KEY, stream_domain)
    ordered: list[tuple[int, str, str]] = []
    for name, value in bucket_id.items():
        if len(name.encode()) > MAX_FIELD_BYTES or len(value.encode()) > MAX_FIELD_BYTES:
            raise InvalidBucket(f"bucket_id entry longer than {MAX_FIELD_BYTES} bytes")
        if name == DOMAIN_KEY:
            continue
        index, sep, key = name.partition(":")
        if not sep or not index.isdigit() or not key:
            raise InvalidBucket(f"bucket_id key {name!r} is not '<index>:<descriptor key>'")
        ordered.append((int(index), key, value))
    ordered.sort()
    if [i for i, _, _ in ordered] != list(range(len(ordered))):
        raise InvalidBucket("bucket_id entry indexes must be 0, 1, ... without gaps")
    return domain, [(key, value) for _, key, value in ordered]


def bucket_limit(
    config: RateLimitConfig, bucket_id: Mapping[str, str], stream_domain: str
) -> BucketLimit:
    """The limit of a bucket; a rate of None when no limit applies (unknown
    domain, no matching rule, an unlimited or shadow rule)."""
    domain, entries = descriptor(bucket_id, stream_domain)
    config_domain = config.domains.get(domain)
    if config_domain is None or not entries:
        return BucketLimit(domain, None, None)
    match = match_descriptor(config_domain, entries)
    if match is None or match.limit.unlimited or match.limit.shadow_mode:
        return BucketLimit(domain, None if match is None else match.limit.rule_id, None)
    limit = match.limit
    return BucketLimit(domain, limit.rule_id, limit.requests_per_unit / limit.window_seconds)
