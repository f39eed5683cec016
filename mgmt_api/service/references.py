"""Which kinds refer to which, read off the kind registry, and the cluster's dangling references.

:func:`mgmt_api.compiler.references.dangling_references` decides; this module
feeds it. The kinds are never listed by hand: a *referring* kind is a
namespaced-manifest kind (:class:`~mgmt_api.kinds.manifest.NamespacedManifestBehaviour`)
of a cluster whose model has a reference field (``targetRef``, ``parentRefs``,
``backendRefs``, :data:`~mgmt_api.compiler.references.REFERENCE_FIELDS`)
anywhere in it; a *checkable* kind is any namespaced-manifest kind of a
cluster, whose objects are named ``{namespace}.{name}``. A kind added to the
registry with a reference field is checked without touching this file.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pydantic
from sqlalchemy.engine import Connection

from meshplane.kinds_contract import Kind
from mgmt_api import fqn as fqnmod
from mgmt_api import kinds
from mgmt_api.compiler.references import (
    REFERENCE_FIELDS,
    DanglingReference,
    Referrer,
    dangling_references,
)
from mgmt_api.kinds.manifest import NamespacedManifestBehaviour
from mgmt_api.store import repo


def _aliases(model: Any, seen: set[int]) -> Iterator[str]:
    """Every field alias (or name) of a pydantic model and the models it contains."""
    if id(model) in seen:
        return
    seen.add(id(model))
    for name, info in model.model_fields.items():
        yield info.alias or name
        yield from _annotation_aliases(info.annotation, seen)


def _annotation_aliases(annotation: Any, seen: set[int]) -> Iterator[str]:
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        yield from _aliases(annotation, seen)
    for arg in getattr(annotation, "__args__", ()) or ():
        yield from _annotation_aliases(arg, seen)


def _manifest_kinds() -> dict[str, NamespacedManifestBehaviour]:
    """Kind → behaviour of every namespaced-manifest kind stored under a cluster."""
    return {
        name: kdef.behaviour
        for name, kdef in kinds.KINDS.items()
        if Kind.CLUSTER in kdef.parents and isinstance(kdef.behaviour, NamespacedManifestBehaviour)
    }


@functools.cache
def referring_kinds() -> tuple[str, ...]:
    """The manifest kinds whose model has a reference field (sorted)."""
    return tuple(
        sorted(
            name
            for name, behaviour in _manifest_kinds().items()
            if REFERENCE_FIELDS.keys() & set(_aliases(behaviour.manifest, set()))
        )
    )


@functools.cache
def checkable_kinds() -> tuple[str, ...]:
    """The manifest kinds a reference can be checked against (the manifest's ``kind``)."""
    return tuple(sorted(_manifest_kinds()))


def _manifest(behaviour: NamespacedManifestBehaviour, spec: dict[str, Any]) -> dict[str, Any]:
    """The stored manifest with the model's defaults filled in (``targetRef.kind``);
    the stored one as it is if the model refuses it (written around the API)."""
    keys = ("apiVersion", "kind", "metadata", "spec")
    doc = {k: spec[k] for k in keys if k in spec}
    try:
        dumped: dict[str, Any] = behaviour.manifest.model_validate(doc).model_dump(
            by_alias=True, mode="json"
        )
    except ValueError:
        return doc
    return dumped


def cluster_dangling(conn: Connection, cluster_fqn: str) -> list[DanglingReference]:
    """The dangling references of the cluster's objects (see the module docstring)."""
    behaviours = _manifest_kinds()
    stored: dict[str, set[tuple[str, str]]] = {}
    referrers: list[Referrer] = []
    for kind in checkable_kinds():
        children = repo.all_children(conn, cluster_fqn, kind)
        stored[behaviours[kind].kind] = {fqnmod.split_namespaced(res.name) for res in children}
        if kind in referring_kinds():
            referrers += [
                Referrer(kind, res.fqn, _manifest(behaviours[kind], res.spec)) for res in children
            ]
    return dangling_references(referrers, stored)
