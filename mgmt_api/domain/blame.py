"""Effective settings with provenance ("blame"), and where a profile may be used.

Settings are nested JSON objects; a *setting* is a leaf, named by the dot-joined
path of keys (``traffic.timeout``). Lists and scalars are leaves; empty objects
set nothing. Layers are applied in order, each one a settings object from a
source (a profile's ``defaults`` or ``mandates``, or the object's own spec):

* a value from ``defaults`` or the object itself replaces earlier ones;
* a value from ``mandates`` replaces earlier *defaults*, and from then on
  nothing replaces it: not a later profile, not the object's own value.

Two paths where one is a prefix of the other (``a`` and ``a.b``) are the same
setting for these rules, so a mandate on ``a.b`` cannot be escaped by writing
``a`` as a whole, and a later ``a`` replaces every earlier ``a.*``.

Everything here is pure; ``mgmt_api.service.profiles`` gathers the layers.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from mgmt_api import fqn as fqnmod


class Section(enum.StrEnum):
    DEFAULTS = "DEFAULTS"
    MANDATES = "MANDATES"
    OWN = "OWN"


class SourceJson(TypedDict):
    fqn: str
    kind: str
    section: str


class ShadowedJson(TypedDict):
    value: Any  # a setting's value: any JSON
    source: SourceJson


class EntryJson(TypedDict):
    """One setting of a blame answer: where its value comes from and what it shadows."""

    path: str
    value: Any  # a setting's value: any JSON
    source: SourceJson
    shadowed: list[ShadowedJson]


@dataclass(frozen=True, slots=True)
class Source:
    fqn: str
    kind: str  # "PROFILE" or "RESOURCE"
    section: Section

    def to_json(self) -> SourceJson:
        return {"fqn": self.fqn, "kind": self.kind, "section": self.section.value}


@dataclass(frozen=True, slots=True)
class Layer:
    source: Source
    settings: Mapping[str, Any]


@dataclass(slots=True)
class Entry:
    path: str
    value: Any
    source: Source
    shadowed: list[tuple[Any, Source]] = field(default_factory=list)

    @property
    def mandated(self) -> bool:
        return self.source.section is Section.MANDATES

    def to_json(self) -> EntryJson:
        return {
            "path": self.path,
            "value": self.value,
            "source": self.source.to_json(),
            "shadowed": [{"value": v, "source": s.to_json()} for v, s in self.shadowed],
        }


def leaves(settings: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(path, value)`` of every setting in ``settings``, depth first, in key order."""
    for key, value in settings.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            yield from leaves(value, path)
        else:
            yield path, value


def _overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def blame(layers: Sequence[Layer]) -> list[Entry]:
    """The effective settings after ``layers``, each with who set it and who lost."""
    entries: list[Entry] = []
    for layer in layers:
        for path, value in leaves(layer.settings):
            clashing = [e for e in entries if _overlaps(e.path, path)]
            mandate = next((e for e in clashing if e.mandated), None)
            if mandate is not None:
                mandate.shadowed.append((value, layer.source))
                continue
            shadowed = [s for e in clashing for s in ((e.value, e.source), *e.shadowed)]
            entries = [e for e in entries if e not in clashing]
            entries.append(Entry(path, value, layer.source, shadowed))
    return sorted(entries, key=lambda e: e.path)


def effective(entries: Sequence[Entry]) -> dict[str, Any]:
    """The settings object the entries add up to (dot paths nested back into objects)."""
    out: dict[str, Any] = {}
    for entry in entries:
        *parents, leaf = entry.path.split(".")
        node = out
        for key in parents:
            child = node.get(key)
            if not isinstance(child, dict):
                child = node[key] = {}
            node = child
        node[leaf] = entry.value
    return out


def usable_at(profile: str, target: str) -> bool:
    """A profile is usable on the object it was created under and below, never above."""
    return fqnmod.parse(profile).parent in fqnmod.ancestors(target)
