"""Service-level settings: failure mode, store timeout, headers, local cache.

These are operator choices about the service, not rate-limit rules, so they
live apart from the descriptor config: an optional YAML file (``--settings``)
whose keys are listed in docs/ratelimit.md, with a few CLI flags on top.
Validation names the file, line and field like the rule config does.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, cast

from meshplane import decision_log
from meshplane.config_error import ConfigError
from meshplane.decision_log import DecisionLogSettings
from meshplane.validate import Fields, Node
from meshplane.yamlconf import load_yaml
from ratelimit.headers import HeaderNames
from ratelimit.plan import PlanBounds
from ratelimit.quota.allocation import DEFAULT_TTL, REPORT_INTERVAL

FailureMode = Literal["unavailable", "allow", "deny"]
FAILURE_MODES: tuple[FailureMode, ...] = ("unavailable", "allow", "deny")
_BOUNDS = PlanBounds()  # the defaults of the request caps and the plan cache


@dataclass(frozen=True)
class Settings:
    """Everything about the service's behaviour that is not a rate-limit rule.

    - ``failure_mode``: what a decision does when Redis cannot answer:
      ``unavailable`` answers gRPC UNAVAILABLE so Envoy's
      ``failure_mode_deny`` decides (the reference's behaviour), ``allow``
      answers OK, ``deny`` answers OVER_LIMIT.
    - ``store_timeout``: seconds a decision waits for Redis; well under
      Envoy's default 20 ms filter timeout so our answer arrives first.
    - ``max_descriptors``, ``max_entries``, ``max_value_bytes``: what one
      request may carry (INVALID_ARGUMENT above); ``plan_cache_bytes``,
      ``plan_cache_entry_bytes``: the plan cache's budget per worker and the
      biggest entry it keeps (see :class:`ratelimit.plan.PlanBounds`).
    """

    failure_mode: FailureMode = "unavailable"
    store_timeout: float = 0.010
    headers_enabled: bool = True
    header_names: HeaderNames = field(default_factory=HeaderNames)
    local_cache_size: int = 100_000
    near_limit_ratio: float = 0.8
    key_prefix: str = "rl:"
    breaker_failures: int = 3
    breaker_open_seconds: float = 1.0
    breaker_min_streak_seconds: float = 0.25
    redis_pipeline_window: float = 0.0005
    redis_pipeline_limit: int = 0
    max_descriptors: int = _BOUNDS.max_descriptors
    max_entries: int = _BOUNDS.max_entries
    max_value_bytes: int = _BOUNDS.max_value_bytes
    plan_cache_bytes: int = _BOUNDS.cache_bytes
    plan_cache_entry_bytes: int = _BOUNDS.cache_entry_bytes
    # The ``decisionLog`` section (None: absent; flags and defaults apply).
    decision_log: DecisionLogSettings | None = None
    # ``quotaMode``: every descriptor in quota mode (the reference's QUOTA_MODE).
    quota_mode: bool = False
    # ``responseDynamicMetadata``: the reference's RESPONSE_DYNAMIC_METADATA.
    dynamic_metadata: bool = False
    # ``detailedMetrics``: the bound on detailed_metric series (docs/ratelimit.md).
    detailed_max_series: int = 1000
    detailed_max_label_bytes: int = 256
    # ``quota``: the RLQS assignment TTL and when a silent gateway's share is given back.
    quota_assignment_ttl: int = DEFAULT_TTL
    quota_stale_after: float = DEFAULT_TTL


@dataclass(frozen=True)
class _Number:
    """A numeric setting: its Settings field, its range, and the unit it is written in."""

    attr: str
    lo: float
    hi: float
    integer: bool = False
    scale: float = 1.0  # Settings value = written value * scale (ms -> s, us -> s)


# Every numeric key, by its place in the file: one table, so the allowed keys of
# each section, the ranges and the conversions cannot disagree.
_NUMBERS: dict[tuple[str, ...], _Number] = {
    ("storeTimeoutMs",): _Number("store_timeout", 1, 10_000, scale=1e-3),
    ("localCacheSize",): _Number("local_cache_size", 0, 10_000_000, integer=True),
    ("nearLimitRatio",): _Number("near_limit_ratio", 0, 1),
    ("redisPipelineWindowUs",): _Number("redis_pipeline_window", 0, 100_000, scale=1e-6),
    ("redisPipelineLimit",): _Number("redis_pipeline_limit", 0, 100_000, integer=True),
    ("breaker", "failures"): _Number("breaker_failures", 1, 1000, integer=True),
    ("breaker", "openSeconds"): _Number("breaker_open_seconds", 0.01, 600),
    ("breaker", "minStreakSeconds"): _Number("breaker_min_streak_seconds", 0, 600),
    ("requests", "maxDescriptors"): _Number("max_descriptors", 1, 4096, integer=True),
    ("requests", "maxEntries"): _Number("max_entries", 1, 1024, integer=True),
    ("requests", "maxValueBytes"): _Number("max_value_bytes", 1, 4 << 20, integer=True),
    ("planCache", "maxBytes"): _Number("plan_cache_bytes", 0, 1 << 34, integer=True),
    ("planCache", "maxEntryBytes"): _Number("plan_cache_entry_bytes", 0, 1 << 34, integer=True),
    ("detailedMetrics", "maxSeries"): _Number("detailed_max_series", 0, 100_000, integer=True),
    ("detailedMetrics", "maxLabelBytes"): _Number(
        "detailed_max_label_bytes", 1, 16_384, integer=True
    ),
    # Both must outlast the gap between two reports, with a second to spare.
    ("quota", "assignmentTtlSeconds"): _Number(
        "quota_assignment_ttl", REPORT_INTERVAL + 1, 86_400, integer=True
    ),
    ("quota", "staleAfterSeconds"): _Number("quota_stale_after", REPORT_INTERVAL + 1, 86_400),
}
#: Boolean keys of the top level, and their Settings fields.
_SWITCHES = {"quotaMode": "quota_mode", "responseDynamicMetadata": "dynamic_metadata"}
_HEADER_NAMES = ("limit", "remaining", "reset", "ratelimited")
_SECTION_KEYS: dict[str, list[str]] = {}
for _path in _NUMBERS:
    if len(_path) == 2:
        _SECTION_KEYS.setdefault(_path[0], []).append(_path[1])
_TOP_KEYS = sorted(
    {path[0] for path in _NUMBERS}
    | {"failureMode", "keyPrefix", "headers", "decisionLog"}
    | set(_SWITCHES)
)


def _read_number(node: Node, spec: _Number) -> float | int:
    if spec.integer:
        return node.integer(int(spec.lo), int(spec.hi))
    return node.number(spec.lo, spec.hi) * spec.scale


def _numbers(fields: Fields) -> dict[str, Any]:
    """Every numeric key present, top level and in the sections, converted."""
    sections: dict[str, Fields] = {}
    for name, keys in _SECTION_KEYS.items():
        node = fields.optional(name)
        if node is not None:
            sections[name] = node.fields(optional=keys)
    out: dict[str, Any] = {}
    for path, spec in _NUMBERS.items():
        holder = fields if len(path) == 1 else sections.get(path[0])
        node = holder.optional(path[-1]) if holder is not None else None
        if node is not None:
            out[spec.attr] = _read_number(node, spec)
    return out


def parse_settings(doc: Any, source: str, base: Settings | None = None) -> Settings:
    """Validate a parsed settings document over ``base`` (defaults)."""
    settings = base or Settings()
    if doc is None:
        return settings
    root = Node(doc, source=source)
    fields = root.fields(optional=_TOP_KEYS)
    changes = _numbers(fields)
    for key, attr in _SWITCHES.items():
        switch = fields.optional(key)
        if switch is not None:
            changes[attr] = switch.boolean()
    mode = fields.optional("failureMode")
    if mode is not None:
        changes["failure_mode"] = cast(FailureMode, mode.choice(FAILURE_MODES))
    prefix = fields.optional("keyPrefix")
    if prefix is not None:
        if not isinstance(prefix.value, str) or "{" in prefix.value or "}" in prefix.value:
            raise prefix.error("must be a string without braces")
        changes["key_prefix"] = prefix.value
    headers = fields.optional("headers")
    if headers is not None:
        changes.update(_headers(headers, settings))
    decisions = fields.optional("decisionLog")
    if decisions is not None:
        changes["decision_log"] = decision_log.parse_section(decisions)
    result = replace(settings, **changes)
    _check_together(result, root, fields)
    return result


def _check_together(result: Settings, root: Node, fields: Fields) -> None:
    """Rules between settings, checked on the merged result."""
    if result.plan_cache_entry_bytes > result.plan_cache_bytes:
        where = fields.optional("planCache") or root
        raise ConfigError(
            f"planCache.maxEntryBytes ({result.plan_cache_entry_bytes}) must be at most"
            f" planCache.maxBytes ({result.plan_cache_bytes})",
            source=root.source,
            line=where.line if where is not root else None,
            field="planCache.maxEntryBytes",
        )
    if result.redis_pipeline_window * 2 > result.store_timeout:
        # A write held longer than this leaves the call too little of its
        # store timeout for the round trip itself.
        key = "redisPipelineWindowUs" if "redisPipelineWindowUs" in fields else "storeTimeoutMs"
        raise root.child(key).error(
            f"redisPipelineWindowUs ({result.redis_pipeline_window * 1e6:g}) must be at most"
            f" half of storeTimeoutMs ({result.store_timeout * 1000:g} ms)"
        )


def _headers(node: Node, settings: Settings) -> dict[str, Any]:
    fields = node.fields(optional=("enabled", *_HEADER_NAMES))
    out: dict[str, Any] = {}
    enabled = fields.optional("enabled")
    if enabled is not None:
        out["headers_enabled"] = enabled.boolean()
    names: dict[str, str] = {}
    for key in _HEADER_NAMES:
        child = fields.optional(key)
        if child is None:
            continue
        value = child.value
        if (
            not isinstance(value, str)
            or not value
            or value != value.strip()
            or any(c in value for c in ": \t\r\n")
        ):
            raise child.error("must be a header name")
        names[key] = value.lower()
    if names:
        out["header_names"] = replace(settings.header_names, **names)
    return out


def load_settings(path: Path, base: Settings | None = None) -> Settings:
    """Read a settings file; raises ConfigError naming file, line and field."""
    return parse_settings(load_yaml(path), str(path), base)
