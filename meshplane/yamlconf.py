"""YAML loading that remembers where every value came from.

Operators fix config faster when an error says ``ratelimit.yaml:14:
descriptors[2].rate_limit.unit: ...``. PyYAML discards positions once it builds
plain dicts, so this loader builds ``LocatedDict``/``LocatedList`` that keep
the line of each key and item. They are ordinary dicts and lists otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, SequenceNode

from meshplane.config_error import ConfigError


class LocatedDict(dict[Any, Any]):
    """A mapping that knows its own line and the line of each key (1-based)."""

    line: int | None = None
    _key_lines: dict[Any, int]

    def line_of(self, key: Any) -> int | None:
        return getattr(self, "_key_lines", {}).get(key, self.line)


class LocatedList(list[Any]):
    """A sequence that knows its own line and the line of each item (1-based)."""

    line: int | None = None
    _item_lines: list[int]

    def line_of(self, index: int) -> int | None:
        lines = getattr(self, "_item_lines", [])
        return lines[index] if 0 <= index < len(lines) else self.line


class _Loader(yaml.SafeLoader):
    """SafeLoader whose mappings and sequences carry line numbers."""

    def construct_located_mapping(self, node: MappingNode) -> LocatedDict:
        self.flatten_mapping(node)
        result = LocatedDict()
        result.line = node.start_mark.line + 1
        result._key_lines = {}
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str | int | float | bool) and key is not None:
                raise ConfigError("mapping keys must be scalars", line=key_node.start_mark.line + 1)
            if key in result:
                raise ConfigError(
                    f"duplicate key {key!r}", line=key_node.start_mark.line + 1, field=str(key)
                )
            result[key] = self.construct_object(value_node, deep=True)
            result._key_lines[key] = key_node.start_mark.line + 1
        return result

    def construct_located_sequence(self, node: SequenceNode) -> LocatedList:
        result = LocatedList(self.construct_object(child, deep=True) for child in node.value)
        result.line = node.start_mark.line + 1
        result._item_lines = [child.start_mark.line + 1 for child in node.value]
        return result


_Loader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _Loader.construct_located_mapping
)
_Loader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _Loader.construct_located_sequence
)


def loads_yaml(text: str, *, source: str | None = None) -> Any:
    """Parse YAML text; syntax errors become a ConfigError with the line."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader derives from SafeLoader
    except ConfigError as exc:
        exc.source = exc.source or source
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        raise ConfigError(
            f"invalid YAML: {exc.problem}",
            source=source,
            line=mark.line + 1 if mark is not None else None,
        ) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", source=source) from exc


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


def load_yaml(path: Path) -> Any:
    """Read and parse one YAML file, naming the file in any error."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read file: {exc}", source=str(path)) from exc
    return loads_yaml(text, source=str(path))
