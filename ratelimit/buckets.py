"""Buckets: fixed epoch-aligned windows and the keys their counters live under.

A bucket is one counter of one limit in one window. Windows are aligned to the
epoch (``start = floor(now / length) * length``), so every service instance
agrees on them without coordination and a bucket refills to full exactly when
the window turns; the window start is part of the key, so the new window is
simply a new key and the old one expires.

Key layout (documented in docs/ratelimit.md)::

    <prefix>{<domain tag>}:<window seconds>:<window start>:<bucket digest>

- ``{<domain tag>}`` is a Redis Cluster hash tag derived from the domain only.
  Every key one request touches must live in the same slot for the Lua script
  to decide atomically over all of them, and a bucket must have the same key
  whichever request it appears in; the domain is the only thing all of a
  request's buckets have in common, so a whole domain lives in one slot, i.e.
  on one Cluster master. Cluster spreads load across domains, not within one.
- The bucket digest hashes the domain and the length-prefixed (key, value)
  path, so values of any length or content give bounded keys that cannot
  collide by concatenation (``a_b``+``c`` vs ``a``+``b_c``), unlike the
  reference's underscore-joined keys.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Sequence
from typing import NamedTuple


class Window(NamedTuple):
    """One fixed window: its length and start, both whole epoch seconds."""

    seconds: int
    start: int

    @property
    def end(self) -> int:
        return self.start + self.seconds

    def reset_after(self, now: float) -> int:
        """Whole seconds until the window turns, in 1..seconds (rounded up).

        Rounding up matches the reference's ``unit - now % unit`` and never
        tells a client to retry before the bucket has actually refilled.
        """
        return max(1, min(self.seconds, math.ceil(self.end - now)))


def window_at(seconds: int, now: float) -> Window:
    """The window of length ``seconds`` containing ``now``."""
    return Window(seconds, int(now // seconds) * seconds)


def domain_tag(domain: str) -> str:
    """The hash tag of a domain: hex, so no domain can contain a brace that breaks it."""
    return hashlib.blake2b(domain.encode(), digest_size=8).hexdigest()


def _bucket_id(prefix: str, domain: str, path: tuple[tuple[str, str], ...]) -> tuple[str, str]:
    digest = hashlib.blake2b(digest_size=16)
    for part in (domain, *(item for pair in path for item in pair)):
        raw = part.encode()
        digest.update(len(raw).to_bytes(4, "big"))
        digest.update(raw)
    return f"{prefix}{{{domain_tag(domain)}}}", digest.hexdigest()


# Hashing is the costly part of a key and does not depend on the window: it is
# cached, so a busy bucket is hashed once rather than in every window. The
# cache holds the request's values, so only short paths are kept, and few:
# at most _CACHED_IDS of at most _CACHED_PATH_CHARS characters (a few MB).
_CACHED_IDS = 16384
_CACHED_PATH_CHARS = 256
_cached_bucket_id = functools.lru_cache(maxsize=_CACHED_IDS)(_bucket_id)


def bucket_key(
    prefix: str,
    domain: str,
    path: Sequence[tuple[str, str]],
    window: Window,
    *,
    sliding: bool = False,
) -> str:
    """The store key of a bucket's counter in ``window``.

    A sliding window's counters are marked (``<seconds>s``): they live twice
    as long, and a fixed and a sliding rule on the same path must never share
    a counter.
    """
    key_path = tuple(path)
    if len(domain) + sum(len(k) + len(v) for k, v in key_path) <= _CACHED_PATH_CHARS:
        head, digest = _cached_bucket_id(prefix, domain, key_path)
    else:
        head, digest = _bucket_id(prefix, domain, key_path)
    mark = "s" if sliding else ""
    return f"{head}:{window.seconds}{mark}:{window.start}:{digest}"


class Bucket(NamedTuple):
    """What a store needs to decide on one counter.

    ``prev_key`` is set for a sliding window: the counter of the window
    before, weighted by how much of it the sliding window still covers
    (see :func:`ratelimit.store.weighted`). Empty for a fixed window.

    ``shadow``: the bucket can never deny. ``quota``: the bucket denies only
    with the request's other quota buckets, when none of them fits (the
    reference's ``quota_mode``, see :func:`ratelimit.store.decide`).
    """

    key: str
    limit: int
    cost: int
    window: Window
    shadow: bool
    prev_key: str = ""
    quota: bool = False

    @property
    def expires(self) -> int:
        """When the counter may be forgotten: its window's end, or a window
        later for a sliding window (it is the next window's previous count)."""
        return self.window.end + self.window.seconds if self.prev_key else self.window.end

    @property
    def need(self) -> int:
        """How much must remain for the bucket to admit: the cost, at least 1.

        So a cost-0 check on an empty bucket is denied, which the reference
        (``counter > limit``) does not do.
        """
        return max(self.cost, 1)
