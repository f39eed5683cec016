"""Pure matching: a request descriptor + a domain's config → the limit that applies.

The rules are envoyproxy/ratelimit's (``GetLimit``), so existing configs keep
their meaning:

- the request's entries are walked level by level; at each level an exact
  ``key=value`` entry wins, then the first wildcard entry (config order) whose
  pattern matches, then the key-only entry;
- a limit applies only when it sits at the request's depth: a request with
  fewer entries, or more entries than the config is deep, gets no limit;
- a ``key=value`` entry without limit and children is an allow-list entry: it
  matches (so the default is not used) and yields no limit.

The result also names the *bucket*: the path of (key, value) pairs that
identifies the counter. It holds the request's runtime values, so a key-only
or wildcard entry gives every distinct value its own counter, except that a
``share_threshold`` wildcard puts its pattern in the path so all matching
values share one counter.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

from ratelimit.config import DescriptorLevel, DescriptorNode, DomainConfig, RateLimit


class Match(NamedTuple):
    """The limit for one request descriptor and the identity of its bucket.

    ``value_metric`` is set when a matched entry has ``value_to_metric``: the
    reference's enhanced stats key (see :func:`value_metric_key`)."""

    limit: RateLimit
    bucket_path: tuple[tuple[str, str], ...]
    value_metric: str | None = None


def _find(level: DescriptorLevel, key: str, value: str) -> DescriptorNode | None:
    node = level.exact.get((key, value))
    if node is not None:
        return node
    for candidate in level.wildcards.get(key, ()):
        assert candidate.value is not None
        if glob_match(candidate.value, value):
            return candidate
    return level.defaults.get(key)


@functools.lru_cache(maxsize=4096)  # the patterns come from the config
def _parts(pattern: str) -> tuple[str, ...]:
    return tuple(pattern.split("*"))


def glob_match(pattern: str, value: str) -> bool:
    """Whether ``value`` matches ``pattern``, whose ``*`` matches any run of characters.

    Without backtracking: the first part must start the value, the last must
    end it, and each part between is taken at its leftmost place after the
    one before (which never loses a match when ``*`` is the only wildcard).
    The regex the config compiles (``.*`` between the parts) backtracks: with
    ``*a*b*c*`` a 16 KB value took minutes, and values come from clients.
    """
    parts = _parts(pattern)
    if len(parts) == 1:
        return value == pattern
    first, last = parts[0], parts[-1]
    end = len(value) - len(last)
    if end < len(first) or not value.startswith(first) or not value.endswith(last):
        return False
    position = len(first)
    for part in parts[1:-1]:
        found = value.find(part, position, end)
        if found < 0:
            return False
        position = found + len(part)
    return True


def value_metric_key(nodes: Sequence[DescriptorNode], entries: Sequence[tuple[str, str]]) -> str:
    """The reference's ``value_to_metric`` stats key (``GetLimit`` in its
    ``src/config/config_impl.go``): per level ``key_value``, where the value is
    the entry's own for an exact match, the request's for a key-only match
    with ``value_to_metric`` (nothing without it), and for a wildcard match
    the request's with ``value_to_metric``, else the pattern (always the
    pattern with ``share_threshold``)."""
    parts: list[str] = []
    for node, (key, value) in zip(nodes, entries, strict=False):
        if node.value is None:
            shown = value if node.value_to_metric else ""
        elif node.pattern is not None:
            shown = value if node.value_to_metric and not node.share_threshold else node.value
        else:
            shown = value
        parts.append(f"{key}_{shown}" if shown else key)
    return ".".join(parts)


def match_descriptor(domain: DomainConfig, entries: Sequence[tuple[str, str]]) -> Match | None:
    """The limit that applies to one descriptor, or None (no limit, allow-listed)."""
    level = domain.root
    path: list[tuple[str, str]] = []
    nodes: list[DescriptorNode] = []
    last = len(entries) - 1
    for depth, (key, value) in enumerate(entries):
        node = _find(level, key, value)
        if node is None:
            return None
        nodes.append(node)
        shared = node.share_threshold and node.value is not None
        path.append((key, node.value if shared and node.value is not None else value))
        if depth == last:
            if node.limit is None:
                return None
            metric = None
            if any(n.value_to_metric for n in nodes):
                metric = value_metric_key(nodes, entries)
            return Match(node.limit, tuple(path), metric)
        if node.children.empty:
            return None  # the request is deeper than the config
        level = node.children
    return None
