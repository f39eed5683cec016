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

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from meshplane.config_error import ConfigError
from meshplane.yamlconf import LocatedDict, LocatedList, load_yaml, loads_yaml
from ratelimit.units import PROTO_UNIT, WINDOW_SECONDS

_MAX_UINT32 = 2**32 - 1

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
_RATE_LIMIT_KEYS = frozenset({"requests_per_unit", "unit", "unlimited", "name", "replaces"})
_TOP_KEYS = frozenset({"domain", "descriptors"})


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


def wildcard_pattern(value: str) -> re.Pattern[str]:
    """Compile a config value where ``*`` matches zero or more characters anywhere."""
    return re.compile(".*".join(re.escape(part) for part in value.split("*")), re.DOTALL)


class _Validator:
    """Walks one parsed file, collecting located errors into ConfigError."""

    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, message: str, *, line: int | None, field: str) -> ConfigError:
        return ConfigError(message, source=self.source, line=line, field=field)

    def scalar_str(self, value: Any, *, line: int | None, field: str) -> str:
        # Go's YAML decoder turns scalars into strings for string fields; so do we.
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, str | int | float):
            return str(value)
        raise self.error("must be a string", line=line, field=field)

    def boolean(self, mapping: LocatedDict, key: str, path: str) -> bool:
        value = mapping.get(key, False)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise self.error("must be true or false", line=mapping.line_of(key), field=path)
        return value

    def unknown_keys(self, mapping: LocatedDict, allowed: frozenset[str], path: str) -> None:
        for key in mapping:
            if key not in allowed:
                where = f"{path}.{key}" if path else str(key)
                raise self.error(f"unknown key {key!r}", line=mapping.line_of(key), field=where)

    def domain_config(self, doc: Any) -> DomainConfig:
        if not isinstance(doc, LocatedDict):
            raise self.error(
                "the file must be a mapping with 'domain' and 'descriptors'",
                line=getattr(doc, "line", None),
                field="",
            )
        self.unknown_keys(doc, _TOP_KEYS, "")
        raw_domain = doc.get("domain")
        domain = (
            ""
            if raw_domain is None
            else self.scalar_str(raw_domain, line=doc.line_of("domain"), field="domain")
        )
        if not domain:
            raise self.error(
                "config file cannot have empty domain", line=doc.line_of("domain"), field="domain"
            )
        root = self.level(doc.get("descriptors"), doc, "descriptors", domain, ())
        return DomainConfig(domain=domain, root=root, source=self.source)

    def level(
        self,
        raw: Any,
        parent: LocatedDict,
        path: str,
        domain: str,
        stats_path: tuple[str, ...],
    ) -> DescriptorLevel:
        if raw is None:
            return DescriptorLevel()
        if not isinstance(raw, LocatedList):
            raise self.error(
                "must be a list of descriptors",
                line=parent.line_of(path.rsplit(".", 1)[-1]),
                field=path,
            )
        exact: dict[tuple[str, str], DescriptorNode] = {}
        wildcards: dict[str, list[DescriptorNode]] = {}
        defaults: dict[str, DescriptorNode] = {}
        seen: set[str] = set()
        for index, item in enumerate(raw):
            item_path = f"{path}[{index}]"
            if not isinstance(item, LocatedDict):
                raise self.error(
                    "list of type other than map", line=raw.line_of(index), field=item_path
                )
            node = self.node(item, item_path, domain, stats_path)
            composite = node.key if node.value is None else f"{node.key}_{node.value}"
            if composite in seen:
                raise self.error(
                    "duplicate descriptor composite key "
                    f"'{domain}.{'.'.join((*stats_path, composite))}'",
                    line=item.line,
                    field=item_path,
                )
            seen.add(composite)
            if node.value is None:
                defaults[node.key] = node
            elif node.pattern is not None:
                wildcards.setdefault(node.key, []).append(node)
            else:
                exact[(node.key, node.value)] = node
        return DescriptorLevel(
            exact=MappingProxyType(exact),
            wildcards=MappingProxyType({k: tuple(v) for k, v in wildcards.items()}),
            defaults=MappingProxyType(defaults),
        )

    def node(
        self, item: LocatedDict, path: str, domain: str, stats_path: tuple[str, ...]
    ) -> DescriptorNode:
        self.unknown_keys(item, _DESCRIPTOR_KEYS, path)
        if self.boolean(item, "quota_mode", path + ".quota_mode"):
            raise self.error(
                "quota_mode is not supported by this service",
                line=item.line_of("quota_mode"),
                field=path + ".quota_mode",
            )
        raw_key = item.get("key")
        key = (
            ""
            if raw_key is None
            else self.scalar_str(raw_key, line=item.line_of("key"), field=path + ".key")
        )
        if not key:
            raise self.error(
                "descriptor has empty key",
                line=item.line_of("key") or item.line,
                field=path + ".key",
            )
        raw_value = item.get("value")
        value = (
            None
            if raw_value is None
            else self.scalar_str(raw_value, line=item.line_of("value"), field=path + ".value")
        )
        if value == "":
            value = None  # Envoy Gateway writes `value: ""` for a key-only entry
        pattern = wildcard_pattern(value) if value is not None and "*" in value else None
        share = self.boolean(item, "share_threshold", path + ".share_threshold")
        if share and pattern is None:
            raise self.error(
                "share_threshold can only be used with wildcard values",
                line=item.line_of("share_threshold"),
                field=path + ".share_threshold",
            )
        shadow = self.boolean(item, "shadow_mode", path + ".shadow_mode")
        for flag in ("detailed_metric", "value_to_metric"):
            self.boolean(item, flag, f"{path}.{flag}")
        if (
            "metadata" in item
            and item["metadata"] is not None
            and not isinstance(item["metadata"], dict)
        ):
            raise self.error(
                "must be a mapping", line=item.line_of("metadata"), field=path + ".metadata"
            )
        own_stats = (*stats_path, key if value is None else f"{key}_{value}")
        limit = None
        if item.get("rate_limit") is not None:
            limit = self.rate_limit(
                item["rate_limit"],
                parent=item,
                path=path + ".rate_limit",
                domain=domain,
                rule_id=".".join(own_stats),
                shadow=shadow,
            )
        children = self.level(
            item.get("descriptors"), item, path + ".descriptors", domain, own_stats
        )
        return DescriptorNode(
            key=key,
            value=value,
            limit=limit,
            pattern=pattern,
            share_threshold=share,
            children=children,
        )

    def rate_limit(
        self,
        raw: Any,
        *,
        parent: LocatedDict,
        path: str,
        domain: str,
        rule_id: str,
        shadow: bool,
    ) -> RateLimit:
        if not isinstance(raw, LocatedDict):
            raise self.error("must be a mapping", line=parent.line_of("rate_limit"), field=path)
        self.unknown_keys(raw, _RATE_LIMIT_KEYS, path)
        unlimited = self.boolean(raw, "unlimited", path + ".unlimited")
        raw_unit = raw.get("unit")
        if unlimited and raw_unit is not None:
            raise self.error(
                "should not specify rate limit unit when unlimited",
                line=raw.line_of("unit"),
                field=path + ".unit",
            )
        unit = "SECOND"
        if not unlimited:
            unit = (
                ""
                if raw_unit is None
                else self.scalar_str(raw_unit, line=raw.line_of("unit"), field=path + ".unit")
            ).upper()
            if unit not in WINDOW_SECONDS:
                raise self.error(
                    f"invalid rate limit unit {raw_unit!r}; expected one of "
                    + ", ".join(u.lower() for u in WINDOW_SECONDS),
                    line=raw.line_of("unit") or raw.line,
                    field=path + ".unit",
                )
        rpu = raw.get("requests_per_unit", 0)
        if rpu is None:
            rpu = 0
        if isinstance(rpu, bool) or not isinstance(rpu, int) or not 0 <= rpu <= _MAX_UINT32:
            raise self.error(
                "must be an integer between 0 and 4294967295",
                line=raw.line_of("requests_per_unit"),
                field=path + ".requests_per_unit",
            )
        raw_name = raw.get("name")
        name = (
            None
            if raw_name is None
            else self.scalar_str(raw_name, line=raw.line_of("name"), field=path + ".name") or None
        )
        replaces = self.replaces(raw, path, name)
        return RateLimit(
            requests_per_unit=rpu,
            unit=unit,
            window_seconds=WINDOW_SECONDS[unit],
            name=name,
            unlimited=unlimited,
            replaces=replaces,
            shadow_mode=shadow,
            domain=domain,
            rule_id=rule_id,
        )

    def replaces(self, raw: LocatedDict, path: str, name: str | None) -> frozenset[str]:
        value = raw.get("replaces")
        if value is None:
            return frozenset()
        field_path = path + ".replaces"
        if not isinstance(value, LocatedList):
            raise self.error(
                "must be a list of {name: ...}", line=raw.line_of("replaces"), field=field_path
            )
        names: set[str] = set()
        for index, entry in enumerate(value):
            where = f"{field_path}[{index}]"
            if not isinstance(entry, LocatedDict):
                raise self.error(
                    "list of type other than map", line=value.line_of(index), field=where
                )
            self.unknown_keys(entry, frozenset({"name"}), where)
            other = entry.get("name")
            other_name = (
                ""
                if other is None
                else self.scalar_str(other, line=entry.line_of("name"), field=where + ".name")
            )
            if not other_name:
                raise self.error(
                    "should not have an empty replaces entry",
                    line=entry.line_of("name") or entry.line,
                    field=where + ".name",
                )
            if other_name == name:
                raise self.error(
                    "replaces should not contain name of same descriptor",
                    line=entry.line_of("name"),
                    field=where + ".name",
                )
            names.add(other_name)
        return frozenset(names)


def parse_domain_file(path: Path) -> DomainConfig:
    """Load one YAML file holding one domain."""
    return _Validator(str(path)).domain_config(load_yaml(path))


def parse_domain(text: str, source: str) -> DomainConfig:
    """Validate one domain document given as text (``source`` names it in errors)."""
    return _Validator(source).domain_config(loads_yaml(text, source=source))


def config_files(path: Path) -> list[Path]:
    """The YAML files a config path stands for: the file, or a directory's *.yaml/*.yml.

    Hidden entries are skipped, which also skips Kubernetes' ``..data`` and
    ``..2024_..`` ConfigMap internals; the visible names are symlinks into them.
    """
    if path.is_dir():
        return sorted(
            p
            for p in path.iterdir()
            if not p.name.startswith(".") and p.suffix in (".yaml", ".yml") and p.is_file()
        )
    return [path]


def load_config(path: Path) -> RateLimitConfig:
    """The FileSource loader: a file or a directory of files, one domain each."""
    if not path.exists():
        raise ConfigError("no such file or directory", source=str(path))
    return RateLimitConfig.of(parse_domain_file(p) for p in config_files(path))
