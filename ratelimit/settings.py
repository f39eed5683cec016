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

from meshplane.config_error import ConfigError
from meshplane.yamlconf import LocatedDict, load_yaml
from ratelimit.headers import HeaderNames
from ratelimit.plan import PlanBounds

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


_KEYS = {
    "failureMode",
    "storeTimeoutMs",
    "headers",
    "localCacheSize",
    "nearLimitRatio",
    "keyPrefix",
    "breaker",
    "redisPipelineWindowUs",
    "redisPipelineLimit",
    "requests",
    "planCache",
}

# Nested sections of integers: YAML key -> {key: (Settings field, low, high)}.
_SECTIONS: dict[str, dict[str, tuple[str, int, int]]] = {
    "requests": {
        "maxDescriptors": ("max_descriptors", 1, 4096),
        "maxEntries": ("max_entries", 1, 1024),
        "maxValueBytes": ("max_value_bytes", 1, 4 << 20),
    },
    "planCache": {
        "maxBytes": ("plan_cache_bytes", 0, 1 << 34),
        "maxEntryBytes": ("plan_cache_entry_bytes", 0, 1 << 34),
    },
}


def _number(
    doc: LocatedDict, key: str, src: str, *, lo: float, hi: float, integer: bool, prefix: str = ""
) -> float:
    value = doc[key]
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok or not lo <= value <= hi:
        kind = "an integer" if integer else "a number"
        span = f"{int(lo)} and {int(hi)}" if integer else f"{lo:g} and {hi:g}"
        raise ConfigError(
            f"must be {kind} between {span}",
            source=src,
            line=doc.line_of(key),
            field=prefix + key,
        )
    return float(value)


def parse_settings(doc: Any, source: str, base: Settings | None = None) -> Settings:
    """Validate a parsed settings document over ``base`` (defaults)."""
    settings = base or Settings()
    if doc is None:
        return settings
    if not isinstance(doc, LocatedDict):
        raise ConfigError("the settings file must be a mapping", source=source)
    for key in doc:
        if key not in _KEYS:
            raise ConfigError(
                f"unknown key {key!r}", source=source, line=doc.line_of(key), field=str(key)
            )
    changes: dict[str, Any] = {}
    if "failureMode" in doc:
        mode = doc["failureMode"]
        if mode not in FAILURE_MODES:
            raise ConfigError(
                "must be one of " + ", ".join(FAILURE_MODES),
                source=source,
                line=doc.line_of("failureMode"),
                field="failureMode",
            )
        changes["failure_mode"] = cast(FailureMode, mode)
    if "storeTimeoutMs" in doc:
        changes["store_timeout"] = (
            _number(doc, "storeTimeoutMs", source, lo=1, hi=10_000, integer=False) / 1000
        )
    if "localCacheSize" in doc:
        changes["local_cache_size"] = int(
            _number(doc, "localCacheSize", source, lo=0, hi=10_000_000, integer=True)
        )
    if "nearLimitRatio" in doc:
        changes["near_limit_ratio"] = _number(
            doc, "nearLimitRatio", source, lo=0, hi=1, integer=False
        )
    if "redisPipelineWindowUs" in doc:
        changes["redis_pipeline_window"] = (
            _number(doc, "redisPipelineWindowUs", source, lo=0, hi=100_000, integer=False) / 1e6
        )
    if "redisPipelineLimit" in doc:
        changes["redis_pipeline_limit"] = int(
            _number(doc, "redisPipelineLimit", source, lo=0, hi=100_000, integer=True)
        )
    if "keyPrefix" in doc:
        prefix = doc["keyPrefix"]
        if not isinstance(prefix, str) or "{" in prefix or "}" in prefix:
            raise ConfigError(
                "must be a string without braces",
                source=source,
                line=doc.line_of("keyPrefix"),
                field="keyPrefix",
            )
        changes["key_prefix"] = prefix
    if "breaker" in doc:
        breaker = doc["breaker"]
        if not isinstance(breaker, LocatedDict):
            raise ConfigError(
                "must be a mapping", source=source, line=doc.line_of("breaker"), field="breaker"
            )
        for key in breaker:
            if key == "failures":
                changes["breaker_failures"] = int(
                    _number(breaker, key, source, lo=1, hi=1000, integer=True, prefix="breaker.")
                )
            elif key == "openSeconds":
                changes["breaker_open_seconds"] = _number(
                    breaker, key, source, lo=0.01, hi=600, integer=False, prefix="breaker."
                )
            elif key == "minStreakSeconds":
                changes["breaker_min_streak_seconds"] = _number(
                    breaker, key, source, lo=0, hi=600, integer=False, prefix="breaker."
                )
            else:
                raise ConfigError(
                    f"unknown key {key!r}",
                    source=source,
                    line=breaker.line_of(key),
                    field=f"breaker.{key}",
                )
    for name, fields in _SECTIONS.items():
        if name in doc:
            changes.update(_section(doc, name, fields, source))
    if "headers" in doc:
        changes.update(_headers(doc["headers"], doc, source, settings))
    result = replace(settings, **changes)
    if result.plan_cache_entry_bytes > result.plan_cache_bytes:
        raise ConfigError(
            f"planCache.maxEntryBytes ({result.plan_cache_entry_bytes}) must be at most"
            f" planCache.maxBytes ({result.plan_cache_bytes})",
            source=source,
            line=doc.line_of("planCache") if "planCache" in doc else None,
            field="planCache.maxEntryBytes",
        )
    if result.redis_pipeline_window * 2 > result.store_timeout:
        # A write held longer than this leaves the call too little of its
        # store timeout for the round trip itself.
        key = "redisPipelineWindowUs" if "redisPipelineWindowUs" in doc else "storeTimeoutMs"
        raise ConfigError(
            f"redisPipelineWindowUs ({result.redis_pipeline_window * 1e6:g}) must be at most"
            f" half of storeTimeoutMs ({result.store_timeout * 1000:g} ms)",
            source=source,
            line=doc.line_of(key),
            field=key,
        )
    return result


def _section(
    doc: LocatedDict, name: str, fields: dict[str, tuple[str, int, int]], source: str
) -> dict[str, int]:
    """A mapping of integer settings, each within its range."""
    section = doc[name]
    if not isinstance(section, LocatedDict):
        raise ConfigError("must be a mapping", source=source, line=doc.line_of(name), field=name)
    out: dict[str, int] = {}
    for key in section:
        if key not in fields:
            raise ConfigError(
                f"unknown key {key!r}",
                source=source,
                line=section.line_of(key),
                field=f"{name}.{key}",
            )
        attr, lo, hi = fields[key]
        out[attr] = int(
            _number(section, key, source, lo=lo, hi=hi, integer=True, prefix=f"{name}.")
        )
    return out


def _headers(raw: Any, doc: LocatedDict, source: str, settings: Settings) -> dict[str, Any]:
    if not isinstance(raw, LocatedDict):
        raise ConfigError(
            "must be a mapping", source=source, line=doc.line_of("headers"), field="headers"
        )
    out: dict[str, Any] = {}
    names: dict[str, str] = {}
    for key, value in raw.items():
        where = f"headers.{key}"
        if key == "enabled":
            if not isinstance(value, bool):
                raise ConfigError(
                    "must be true or false", source=source, line=raw.line_of(key), field=where
                )
            out["headers_enabled"] = value
        elif key in ("limit", "remaining", "reset", "ratelimited"):
            if (
                not isinstance(value, str)
                or not value
                or value != value.strip()
                or any(c in value for c in ": \t\r\n")
            ):
                raise ConfigError(
                    "must be a header name", source=source, line=raw.line_of(key), field=where
                )
            names[key] = value.lower()
        else:
            raise ConfigError(
                f"unknown key {key!r}", source=source, line=raw.line_of(key), field=where
            )
    if names:
        out["header_names"] = replace(settings.header_names, **names)
    return out


def load_settings(path: Path, base: Settings | None = None) -> Settings:
    """Read a settings file; raises ConfigError naming file, line and field."""
    return parse_settings(load_yaml(path), str(path), base)
