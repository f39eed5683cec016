"""The resource kinds meshctl knows, and the mapping between names, FQNs and REST paths.

The kinds are the one table of the API's public contract,
:mod:`meshplane.kinds_contract` (``docs/api.md``, "FQNs and paths"), which the
server's registry is built on too: meshctl still talks to the REST API only
and imports no server package. An FQN alternates collection and name; the
REST path of an object is ``/v2/`` + its FQN; creating posts ``{"name",
"<bodyField>": {...}}`` to the collection, and listing answers
``{"<listField>": [...], "nextPageToken"}``.

A kind can live under several parents (a User is global or in an
organization; a ServiceAccount is in an organization or a cluster). Each
alternative is a chain of parent kinds, outermost first; the chain used is the
longest one whose parent names are all known.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from meshctl.errors import Exit, MeshctlError
from meshplane import kinds_contract
from meshplane.kinds_contract import Kind as KindName

POLICY_KIND = KindName.ACCESS_POLICY.value


@dataclass(frozen=True, slots=True)
class Kind:
    name: str  # "Cluster"
    collection: str  # "clusters"
    body_field: str  # create body wrapper: "cluster"
    list_field: str  # list response field: "clusters"
    chains: tuple[tuple[str, ...], ...]  # alternative parent chains (kind names)
    aliases: tuple[str, ...] = ()
    # Fields the server owns: shown under ``status`` and never sent back.
    status_fields: frozenset[str] = field(default_factory=frozenset)
    # Values the server fills in when a field is omitted (docs/api.md), so that
    # apply can tell "unchanged" from "would reset to the default".
    defaults: tuple[tuple[str, object], ...] = ()

    @property
    def metadata_key(self) -> str:
        """The key naming an object of this kind as a parent, e.g. ``organization``."""
        return self.name[0].lower() + self.name[1:]

    @property
    def flag(self) -> str:
        """The CLI option naming a parent of this kind: ``--org``, ``--security-group``."""
        if self.name == KindName.ORGANIZATION:
            return "--org"
        return "--" + re.sub(r"(?<!^)([A-Z])", r"-\1", self.name).lower()


# Server defaults of omitted fields that apply compares against (client-side only).
_DEFAULTS: dict[str, tuple[tuple[str, object], ...]] = {
    KindName.CLUSTER: (("tokenTtl", "3600s"), ("tier1Cluster", False)),
}


def _kind(shape: kinds_contract.KindShape) -> Kind:
    return Kind(
        shape.kind.value,
        shape.collection,
        shape.body_field,
        shape.list_field,
        tuple(tuple(p.value for p in chain) for chain in kinds_contract.chains(shape.kind)),
        shape.aliases,
        shape.server_fields,
        _DEFAULTS.get(shape.kind, ()),
    )


KINDS: dict[str, Kind] = {s.kind.value: _kind(s) for s in kinds_contract.CRUD_KINDS}

# Fields every object carries that are bookkeeping, not desired state.
METADATA_FIELDS = kinds_contract.COMMON_FIELDS

_BY_COLLECTION = {k.collection: k for k in KINDS.values()}


def lookup_kind(word: str) -> Kind | None:
    """A kind by name, plural, collection or alias, case-insensitively."""
    shape = kinds_contract.lookup(word)
    return KINDS[shape.kind] if shape is not None else None


def is_policy_word(word: str) -> bool:
    return kinds_contract.is_policy_word(word)


def require_kind(word: str) -> Kind:
    kind = lookup_kind(word)
    if kind is None:
        known = ", ".join(k.name for k in KINDS.values())
        raise MeshctlError(
            f"unknown kind {word!r}; known kinds: {known}, {POLICY_KIND}", Exit.USAGE
        )
    return kind


@dataclass(frozen=True, slots=True)
class Ref:
    """One object: its kind, name, and the names of its parents."""

    kind: Kind
    name: str
    parents: tuple[tuple[Kind, str], ...]

    @property
    def fqn(self) -> str:
        return "/".join(
            [
                *(f"{k.collection}/{n}" for k, n in self.parents),
                f"{self.kind.collection}/{self.name}",
            ]
        )

    @property
    def path(self) -> str:
        return "/v2/" + self.fqn

    @property
    def collection_path(self) -> str:
        return collection_path(self.kind, self.parents)

    def parent_names(self) -> dict[str, str]:
        return {k.metadata_key: n for k, n in self.parents}

    def describe(self) -> str:
        """How output names the object: its kind as manifests spell it, and its FQN."""
        return describe(self.kind.name, self.fqn)


def describe(kind: str, target: str) -> str:
    """The one way meshctl's output names an object or policy: ``User organizations/o/users/a``."""
    return f"{kind} {target}"


def describe_policy(target: str) -> str:
    return describe(POLICY_KIND, target or "root")


def collection_path(kind: Kind, parents: tuple[tuple[Kind, str], ...]) -> str:
    prefix = "/".join(f"{k.collection}/{n}" for k, n in parents)
    return "/v2/" + (f"{prefix}/" if prefix else "") + kind.collection


def resolve_parents(kind: Kind, names: Mapping[str, str | None]) -> tuple[tuple[Kind, str], ...]:
    """Pick the longest parent chain of ``kind`` whose names are all in ``names``.

    ``names`` maps metadata keys (``organization``, ``tenant``, ``workspace``,
    ``cluster``) to names. Raises a usage error naming what is missing.
    """
    for chain in sorted(kind.chains, key=len, reverse=True):
        values = [names.get(KINDS[p].metadata_key) for p in chain]
        if all(values):
            return tuple((KINDS[p], v) for p, v in zip(chain, values, strict=True) if v)
    needed = " and ".join(KINDS[p].flag for p in min(kind.chains, key=len))
    raise MeshctlError(
        f"a {kind.name} lives under a parent: pass {needed} (or set a default with "
        "meshctl config set-profile), or give its FQN",
        Exit.USAGE,
    )


def child_kinds(ref: Ref) -> list[Kind]:
    """The kinds that can live directly under ``ref`` (by the parent chain it ends)."""
    chain = (*(k.name for k, _ in ref.parents), ref.kind.name)
    return [k for k in KINDS.values() if chain in k.chains]


def parse_fqn(fqn: str) -> Ref:
    """``organizations/o/clusters/c`` -> Ref(Cluster, "c", ((Organization, "o"),))."""
    text = fqn.strip().strip("/")
    if text.startswith("v2/"):
        text = text[3:]
    parts = text.split("/")
    if len(parts) < 2 or len(parts) % 2:
        raise MeshctlError(
            f"{fqn!r} is not an FQN (collection/name pairs such as organizations/o/clusters/c)",
            Exit.USAGE,
        )
    pairs: list[tuple[Kind, str]] = []
    for i in range(0, len(parts), 2):
        kind = _BY_COLLECTION.get(parts[i])
        if kind is None or not parts[i + 1]:
            raise MeshctlError(f"{fqn!r}: unknown collection {parts[i]!r}", Exit.USAGE)
        pairs.append((kind, parts[i + 1]))
    kind, name = pairs[-1]
    chain = tuple(k.name for k, _ in pairs[:-1])
    if chain not in kind.chains:
        raise MeshctlError(f"{fqn!r}: a {kind.name} cannot live there", Exit.USAGE)
    return Ref(kind, name, tuple(pairs[:-1]))


def parent_keys() -> tuple[str, ...]:
    """The metadata keys that can name a parent."""
    return tuple(KINDS[k].metadata_key for k in kinds_contract.PARENT_KINDS)


def policy_path(target: str) -> str:
    """REST path of the access policy of ``target`` (an FQN, ``root`` or ``rbac``)."""
    t = target.strip().strip("/")
    if t in {"", "root", "admin/root"}:
        return "/v2/admin/root/policy"
    if t in {"rbac", "admin/rbac"}:
        return "/v2/admin/rbac/policy"
    return parse_fqn(t).path + "/policy"
