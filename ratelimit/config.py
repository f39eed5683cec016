"""Load and validate envoyproxy/ratelimit's YAML config into immutable snapshots.

The format is the reference service's own (one ``domain`` per file, nested
``descriptors`` with ``key``/``value``/``rate_limit``/``shadow_mode``), so its
users switch without rewriting anything, and the management plane compiles
BackendTrafficPolicy into exactly what an operator could write by hand.

Validation names the file, the line and the field of every problem (via
``meshplane.yamlconf``), because a bad ConfigMap is usually found by reading the
error message in a crash-looping pod's log.

The result is a tree of frozen dataclasses whose children are pre-indexed the
way matching walks them (exact ``key=value``, wildcards in config order,
key-only defaults), so the hot path does dictionary look-ups only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from meshplane.config_error import ConfigError
from meshplane.validate import Fields, Node
from meshplane.yamlconf import config_files, load_yaml, loads_yaml
from ratelimit.units import PROTO_UNIT, WINDOW_SECONDS

_MAX_UINT32 = 2**32 - 1

#: The longest window a limit may have (unit times unit_multiplier): 365 days.
MAX_WINDOW_SECONDS = WINDOW_SECONDS["YEAR"]

_DESCRIPTOR_KEYS = frozenset(
    {
        "key",
        "value",
        "rate_limit",
        "descriptors",
        "shadow_mode",
        "share_threshold",
        "detailed_metric",
        "value_to_metric",
        "metadata",
        "quota_mode",
    }
)
_RATE_LIMIT_KEYS = frozenset(
    {"requests_per_unit", "unit", "unit_multiplier", "algorithm", "unlimited", "name", "replaces"}
)
#: ``rate_limit.algorithm`` values; fixed_window (spec 4.10.2) is the default.
ALGORITHMS = ("fixed_window", "sliding_window")
_TOP_KEYS = frozenset({"domain", "descriptors"})
_REPLACES_KEYS = frozenset({"name"})


@dataclass(frozen=True, slots=True)
class RateLimit:
    """One configured limit: a bucket of ``requests_per_unit`` per window.

    ``rule_id`` is the reference's stats path (``key_value.key2``), built from
    the config and never from request values, so it is safe as a metric label.
    """

    requests_per_unit: int
    unit: str
    window_seconds: int
    name: str | None
    unlimited: bool
    replaces: frozenset[str]
    shadow_mode: bool
    domain: str
    rule_id: str
    #: The weighted two-window count instead of fixed windows (docs/ratelimit.md).
    sliding: bool = False
    #: The descriptor's ``quota_mode``: over its limit, it denies only when every
    #: quota descriptor of the request is over too (docs/ratelimit.md, Quota mode).
    quota_mode: bool = False
    #: The descriptor's ``detailed_metric``: its hits are counted under the
    #: request's own values (bounded, docs/ratelimit.md, Metrics).
    detailed_metric: bool = False
    #: The descriptor's ``metadata`` (JSON-like, read only), returned in the
    #: response's dynamic metadata when the request passes it (docs/ratelimit.md).
    metadata: Mapping[str, Any] | None = field(default=None, hash=False)

    @property
    def proto_unit(self) -> int:
        """The Envoy RateLimitResponse.RateLimit.Unit value of ``unit``."""
        return PROTO_UNIT[self.unit]


@dataclass(frozen=True, slots=True)
class DescriptorNode:
    """A config descriptor entry and the level below it.

    ``value`` is None for a key-only (default) entry, which gives every
    distinct runtime value its own bucket. ``pattern`` is set for wildcard
    values. An entry with a value, no limit and no children is an allow-list
    entry: it matches, so it shadows the default, and yields no limit.
    """

    key: str
    value: str | None
    limit: RateLimit | None
    pattern: re.Pattern[str] | None
    share_threshold: bool
    children: DescriptorLevel
    #: ``value_to_metric``: the metric label holds the request's value at this
    #: level (bounded like detailed_metric; see ratelimit.matching).
    value_to_metric: bool = False


@dataclass(frozen=True, slots=True)
class DescriptorLevel:
    """The entries at one depth, indexed in matching order."""

    exact: Mapping[tuple[str, str], DescriptorNode] = field(
        default_factory=lambda: MappingProxyType({})
    )
    wildcards: Mapping[str, tuple[DescriptorNode, ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    defaults: Mapping[str, DescriptorNode] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def empty(self) -> bool:
        return not (self.exact or self.wildcards or self.defaults)


@dataclass(frozen=True, slots=True)
class DomainConfig:
    """The descriptor tree of one domain and where it was loaded from."""

    domain: str
    root: DescriptorLevel
    source: str


@dataclass(frozen=True, slots=True)
class RateLimitConfig:
    """A validated snapshot of every domain; swapped whole on reload."""

    domains: Mapping[str, DomainConfig]

    @classmethod
    def of(cls, domains: Iterable[DomainConfig]) -> RateLimitConfig:
        """Build a snapshot, rejecting a domain defined twice."""
        by_name: dict[str, DomainConfig] = {}
        for dom in domains:
            if dom.domain in by_name:
                raise ConfigError(
                    f"duplicate domain {dom.domain!r} (also in {by_name[dom.domain].source})",
                    source=dom.source,
                    field="domain",
                )
            by_name[dom.domain] = dom
        return cls(MappingProxyType(by_name))

    def rules(self) -> set[tuple[str, str]]:
        """``(domain, rule_id)`` of every configured limit: the per-rule metric labels."""
        found: set[tuple[str, str]] = set()
        for dom in self.domains.values():
            pending = [dom.root]
            while pending:
                level = pending.pop()
                nodes = [*level.exact.values(), *level.defaults.values()]
                nodes += [node for group in level.wildcards.values() for node in group]
                for node in nodes:
                    if node.limit is not None:
                        found.add((node.limit.domain, node.limit.rule_id))
                    pending.append(node.children)
        return found


def wildcard_pattern(value: str) -> re.Pattern[str]:
    """Compile a config value where ``*`` matches zero or more characters anywhere."""
    return re.compile(".*".join(re.escape(part) for part in value.split("*")), re.DOTALL)


def _scalar(node: Node) -> str:
    """A string field read as the reference's Go decoder reads it: any scalar is its
    text (``value: 1``, ``value: true``), and null or absent is the empty string."""
    value = node.value
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise node.error("must be a string")


def _flag(f: Fields, key: str) -> bool:
    """A boolean field; null or absent is false, as in the reference's decoder."""
    node = f.present(key)
    return node.boolean() if node is not None else False


def _entry(node: Node, keys: frozenset[str]) -> Fields:
    """A list item that must be a mapping of ``keys`` (the reference's wording)."""
    if not isinstance(node.value, dict):
        raise node.error("list of type other than map")
    return node.fields(optional=keys)


def _domain_config(doc: Any, source: str) -> DomainConfig:
    root = Node(doc, source=source)
    if not isinstance(doc, dict):
        raise root.error("the file must be a mapping with 'domain' and 'descriptors'")
    root.fields(optional=_TOP_KEYS)
    domain_node = root.child("domain")
    domain = _scalar(domain_node)
    if not domain:
        raise domain_node.error("config file cannot have empty domain")
    level = _level(root.child("descriptors"), domain, ())
    return DomainConfig(domain=domain, root=level, source=source)


def _level(node: Node, domain: str, stats_path: tuple[str, ...]) -> DescriptorLevel:
    if node.value is None:
        return DescriptorLevel()
    exact: dict[tuple[str, str], DescriptorNode] = {}
    wildcards: dict[str, list[DescriptorNode]] = {}
    defaults: dict[str, DescriptorNode] = {}
    seen: set[str] = set()
    for item in node.items(of="descriptors"):
        entry = _descriptor(_entry(item, _DESCRIPTOR_KEYS), domain, stats_path)
        composite = entry.key if entry.value is None else f"{entry.key}_{entry.value}"
        if composite in seen:
            raise item.error(
                "duplicate descriptor composite key "
                f"'{domain}.{'.'.join((*stats_path, composite))}'"
            )
        seen.add(composite)
        if entry.value is None:
            defaults[entry.key] = entry
        elif entry.pattern is not None:
            wildcards.setdefault(entry.key, []).append(entry)
        else:
            exact[(entry.key, entry.value)] = entry
    return DescriptorLevel(
        exact=MappingProxyType(exact),
        wildcards=MappingProxyType({k: tuple(v) for k, v in wildcards.items()}),
        defaults=MappingProxyType(defaults),
    )


def _descriptor(f: Fields, domain: str, stats_path: tuple[str, ...]) -> DescriptorNode:
    item = f.node
    key_node = item.child("key")
    key = _scalar(key_node)
    if not key:
        raise key_node.error("descriptor has empty key")
    # Envoy Gateway writes `value: ""` for a key-only entry.
    value = _scalar(item.child("value")) or None
    pattern = wildcard_pattern(value) if value is not None and "*" in value else None
    share = _flag(f, "share_threshold")
    if share and pattern is None:
        raise item.child("share_threshold").error(
            "share_threshold can only be used with wildcard values"
        )
    flags = _Flags(
        shadow=_flag(f, "shadow_mode"),
        quota=_flag(f, "quota_mode"),
        detailed=_flag(f, "detailed_metric"),
        metadata=_metadata(f.present("metadata")),
    )
    own_stats = (*stats_path, key if value is None else f"{key}_{value}")
    rate_limit = f.present("rate_limit")
    limit = None
    if rate_limit is not None:
        limit = _rate_limit(rate_limit, domain=domain, rule_id=".".join(own_stats), flags=flags)
    return DescriptorNode(
        key=key,
        value=value,
        limit=limit,
        pattern=pattern,
        share_threshold=share,
        children=_level(item.child("descriptors"), domain, own_stats),
        value_to_metric=_flag(f, "value_to_metric"),
    )


class _Flags(NamedTuple):
    """What a descriptor entry says about its limit besides ``rate_limit``."""

    shadow: bool
    quota: bool
    detailed: bool
    metadata: Mapping[str, Any] | None


#: How deep a descriptor's ``metadata`` may nest: it is copied into responses,
#: and a deeper document is a mistake, not a policy.
MAX_METADATA_DEPTH = 16


def _metadata(node: Node | None) -> Mapping[str, Any] | None:
    """A descriptor's ``metadata``: a mapping of JSON-like values, as the
    reference's ``structpb.NewStruct`` accepts (null, booleans, numbers,
    strings, lists, mappings with string keys). Empty or absent is None."""
    if node is None:
        return None
    if not isinstance(node.value, dict):
        raise node.error("must be a mapping")
    plain = _json_like(node, node.value, 0)
    return MappingProxyType(plain) if plain else None


def _json_like(node: Node, value: Any, depth: int) -> Any:
    if depth > MAX_METADATA_DEPTH:
        raise node.error(f"nests deeper than {MAX_METADATA_DEPTH} levels")
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise node.error(f"key {key!r} must be a string")
            out[key] = _json_like(node, item, depth + 1)
        return out
    if isinstance(value, list):
        return [_json_like(node, item, depth + 1) for item in value]
    if value is None or isinstance(value, bool | int | float | str):
        if isinstance(value, float) and not math.isfinite(value):
            raise node.error("numbers must be finite")
        return value
    raise node.error(f"holds {type(value).__name__} values; only JSON-like values are allowed")


def _rate_limit(node: Node, *, domain: str, rule_id: str, flags: _Flags) -> RateLimit:
    f = node.fields(optional=_RATE_LIMIT_KEYS)
    unlimited = _flag(f, "unlimited")
    unit_node = node.child("unit")
    if unlimited and unit_node.value is not None:
        raise unit_node.error("should not specify rate limit unit when unlimited")
    unit = "SECOND"
    if not unlimited:
        unit = _scalar(unit_node).upper()
        if unit not in WINDOW_SECONDS:
            raise unit_node.error(
                f"invalid rate limit unit {unit_node.value!r}; expected one of "
                + ", ".join(u.lower() for u in WINDOW_SECONDS)
            )
    rpu = f.present("requests_per_unit")
    name = _scalar(node.child("name")) or None
    return RateLimit(
        requests_per_unit=rpu.integer(0, _MAX_UINT32) if rpu is not None else 0,
        unit=unit,
        window_seconds=WINDOW_SECONDS[unit] * _multiplier(f, unit, unlimited),
        name=name,
        unlimited=unlimited,
        replaces=_replaces(f.present("replaces"), name),
        shadow_mode=flags.shadow,
        domain=domain,
        rule_id=rule_id,
        sliding=_algorithm(f, unlimited) == "sliding_window",
        quota_mode=flags.quota,
        detailed_metric=flags.detailed,
        metadata=flags.metadata,
    )


def _algorithm(f: Fields, unlimited: bool) -> str:
    """``algorithm``: fixed_window (absent or null) or sliding_window."""
    node = f.present("algorithm")
    if node is None:
        return "fixed_window"
    if unlimited:
        raise node.error("should not specify algorithm when unlimited")
    return node.choice(ALGORITHMS)


def _multiplier(f: Fields, unit: str, unlimited: bool) -> int:
    """``unit_multiplier``: the window is that many units (absent or null: one).

    It is capped so that no window is longer than :data:`MAX_WINDOW_SECONDS`:
    a longer one would keep a counter (and its TTL) for more than a year,
    which is a typo far more often than a policy.
    """
    node = f.present("unit_multiplier")
    if node is None:
        return 1
    if unlimited:
        raise node.error("should not specify unit_multiplier when unlimited")
    most = MAX_WINDOW_SECONDS // WINDOW_SECONDS[unit]
    value = node.value
    if isinstance(value, int) and not isinstance(value, bool) and value > most:
        raise node.error(
            f"a window of {value} {unit.lower()}s is longer than 365 days;"
            f" at most {most} are allowed with unit {unit.lower()}"
        )
    return node.integer(1, most)


def _replaces(node: Node | None, name: str | None) -> frozenset[str]:
    names: set[str] = set()
    for item in node.items(of="{name: ...}") if node is not None else []:
        other_node = _entry(item, _REPLACES_KEYS).node.child("name")
        other = _scalar(other_node)
        if not other:
            raise other_node.error("should not have an empty replaces entry")
        if other == name:
            raise other_node.error("replaces should not contain name of same descriptor")
        names.add(other)
    return frozenset(names)


def parse_domain_file(path: Path) -> DomainConfig:
    """Load one YAML file holding one domain."""
    return _domain_config(load_yaml(path), str(path))


def parse_domain(text: str, source: str) -> DomainConfig:
    """Validate one domain document given as text (``source`` names it in errors)."""
    return _domain_config(loads_yaml(text, source=source), source)


def load_config(path: Path) -> RateLimitConfig:
    """The FileSource loader: a file or a directory of files, one domain each."""
    if not path.exists():
        raise ConfigError("no such file or directory", source=str(path))
    return RateLimitConfig.of(parse_domain_file(p) for p in config_files(path))
