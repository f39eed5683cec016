"""References to objects that do not exist: the "mistakes show green" check (pure).

A BackendTrafficPolicy whose ``targetRef`` names a route nobody stored, an
HTTPRoute whose ``backendRefs`` name a Backend that is not there: the API
accepts both (the target may be created next, as in Kubernetes), but the
cluster's status and its ``envoyconfig`` must say so, naming the object and
the missing target, instead of showing everything applied.

:func:`dangling_references` is the one place that decides it, for every
kind: the caller gives each referring object as the full manifest (the
compiler model's dump, so defaults such as ``targetRef.kind: HTTPRoute`` are
present) and the names of the stored objects of every kind a reference could
be checked against. A reference whose ``kind`` is not among those (a
Kubernetes ``Service``, a ``Gateway``, which names itself in its bootstrap)
is not something the management plane stores, so it is never reported.
Which kinds refer and which can be referred to is the kind registry's
business (:mod:`mgmt_api.service.references`); nothing here names a kind.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Set
from dataclasses import dataclass
from typing import Any

#: Reference fields (Gateway API spelling): how a warning says what they do, and
#: what a missing target means until it is created.
REFERENCE_FIELDS: Mapping[str, tuple[str, str]] = {
    "targetRef": ("targets", "it has no effect"),
    "targetRefs": ("targets", "it has no effect"),
    "parentRefs": ("attaches to", "it has no effect"),
    "backendRefs": ("sends traffic to", "the requests it sends there get 503"),
}
#: A field not in :data:`REFERENCE_FIELDS` (never reported; the message's fallback).
_UNKNOWN_FIELD = ("names", "it has no effect")


@dataclass(frozen=True)
class Referrer:
    """One stored object that may refer to others: its kind, FQN and manifest."""

    kind: str
    fqn: str
    manifest: Mapping[str, Any]  # {apiVersion, kind, metadata, spec}, defaults filled in


@dataclass(frozen=True)
class DanglingReference:
    """``fqn`` (a ``kind``) names ``target_kind`` ``namespace/name`` at ``field``,
    and no such object is stored in the cluster."""

    fqn: str
    kind: str
    field: str  # where, as a manifest writes it: "spec.targetRef"
    target_kind: str
    namespace: str
    name: str

    @property
    def message(self) -> str:
        field = self.field.rsplit(".", 1)[-1].split("[", 1)[0]
        verb, consequence = REFERENCE_FIELDS.get(field, _UNKNOWN_FIELD)
        return (
            f"{self.kind} {self.fqn} {verb} {self.target_kind} {self.namespace}/{self.name}, "
            f"which does not exist in the cluster ({self.field}): {consequence} until "
            "that object is created"
        )

    def to_json(self) -> dict[str, str]:
        return {
            "object": self.fqn,
            "kind": self.kind,
            "field": self.field,
            "targetKind": self.target_kind,
            "targetNamespace": self.namespace,
            "targetName": self.name,
            "message": self.message,
        }


def _refs(node: Any, path: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(field path, reference) of every reference field anywhere under ``node``."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            here = f"{path}.{key}" if path else str(key)
            if key in REFERENCE_FIELDS:
                if isinstance(value, Mapping):
                    yield here, value
                elif isinstance(value, list | tuple):
                    for i, item in enumerate(value):
                        if isinstance(item, Mapping):
                            yield f"{here}[{i}]", item
                continue
            yield from _refs(value, here)
    elif isinstance(node, list | tuple):
        for i, item in enumerate(node):
            yield from _refs(item, f"{path}[{i}]")


def dangling_references(
    referrers: Iterable[Referrer], stored: Mapping[str, Set[tuple[str, str]]]
) -> list[DanglingReference]:
    """Every reference of ``referrers`` to an object of a checked kind that is missing.

    ``stored`` maps each checkable kind to the (namespace, name) of its stored
    objects in the cluster; a reference without a namespace means the
    referrer's own. Sorted by object, then field, so the status is stable.
    """
    out: list[DanglingReference] = []
    for referrer in referrers:
        metadata = referrer.manifest.get("metadata") or {}
        own_namespace = str(metadata.get("namespace") or "default")
        for field, ref in _refs(referrer.manifest.get("spec") or {}, "spec"):
            target_kind = str(ref.get("kind") or "")
            if target_kind not in stored:
                continue
            namespace = str(ref.get("namespace") or own_namespace)
            name = str(ref.get("name") or "")
            if (namespace, name) not in stored[target_kind]:
                out.append(
                    DanglingReference(
                        referrer.fqn, referrer.kind, field, target_kind, namespace, name
                    )
                )
    return sorted(out, key=lambda d: (d.fqn, d.field))
