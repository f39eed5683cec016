"""Resource files: the manifest format and its mapping onto API objects.

A manifest is::

    apiVersion: meshplane.io/v2
    kind: Cluster
    metadata:
      name: c1
      organization: o1      # parents by kind: organization, tenant, workspace, cluster
      etag: '"91bb..."'     # optional; when given, apply refuses to overwrite newer changes
    spec:                   # every other field of the API object, camelCase, as the API has it
      displayName: C1
      network: vpc-1
    status: {...}           # output only (server- or agent-owned fields); ignored on input

``metadata.fqn`` may replace the name and parents. Files may hold several
YAML documents (``---``), a JSON object, a JSON array, or a ``kind: List``
with ``items``. Output of ``meshctl get -o yaml`` is valid input, so
get/edit/apply round-trip.

The split between ``metadata`` and ``spec`` is by ownership: metadata
identifies the object and carries the server's bookkeeping (fqn, etag,
times); spec is exactly what a PUT replaces; status is what only the
server or the cluster agents write.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from meshctl.errors import Exit, MeshctlError
from meshctl.kinds import (
    METADATA_FIELDS,
    POLICY_KIND,
    Kind,
    Ref,
    describe_policy,
    is_policy_word,
    parent_keys,
    parse_fqn,
    require_kind,
    resolve_parents,
)

API_VERSION = "meshplane.io/v2"
_TOP_KEYS = {"apiVersion", "kind", "metadata", "spec", "status"}


@dataclass(frozen=True, slots=True)
class Manifest:
    """One parsed document: an object (``ref``) or an access policy (``policy_target``)."""

    ref: Ref | None
    policy_target: str | None
    spec: dict[str, Any]
    etag: str | None
    source: str

    def describe(self) -> str:
        if self.ref is not None:
            return self.ref.describe()
        return describe_policy(self.policy_target or "root")


def load_documents(text: str, source: str) -> list[Any]:
    """YAML (multi-document) or JSON text -> a flat list of documents."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or exc.__class__.__name__
        raise MeshctlError(
            f"{source}{where}: not valid YAML or JSON: {problem}", Exit.USAGE
        ) from exc
    out: list[Any] = []
    for doc in docs:
        if isinstance(doc, list):
            out.extend(doc)
        elif isinstance(doc, Mapping) and doc.get("kind") == "List":
            items = doc.get("items")
            if not isinstance(items, list):
                raise MeshctlError(f"{source}: a List needs an items array", Exit.USAGE)
            out.extend(items)
        else:
            out.append(doc)
    return out


def parse_manifest(doc: Any, source: str) -> Manifest:
    """Validate one document and resolve it to an object reference."""
    if not isinstance(doc, Mapping):
        raise MeshctlError(f"{source}: each document must be a mapping", Exit.USAGE)
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise MeshctlError(
            f"{source}: unknown top-level field {unknown[0]!r} (expected apiVersion, kind, "
            "metadata, spec)",
            Exit.USAGE,
        )
    version = doc.get("apiVersion", API_VERSION)
    if version != API_VERSION:
        raise MeshctlError(
            f"{source}: apiVersion {version!r} is not supported (use {API_VERSION})", Exit.USAGE
        )
    kind_word = doc.get("kind")
    if not isinstance(kind_word, str) or not kind_word:
        raise MeshctlError(f"{source}: kind is required", Exit.USAGE)
    metadata = doc.get("metadata") or {}
    spec = doc.get("spec") or {}
    if not isinstance(metadata, Mapping) or not isinstance(spec, Mapping):
        raise MeshctlError(f"{source}: metadata and spec must be mappings", Exit.USAGE)
    etag = metadata.get("etag")
    if etag is not None and not isinstance(etag, str):
        raise MeshctlError(f"{source}: metadata.etag must be a string", Exit.USAGE)
    where = f"{source} ({kind_word} {metadata.get('name') or metadata.get('fqn') or ''})".strip()

    if is_policy_word(kind_word):
        target = metadata.get("target", metadata.get("fqn", "root"))
        if not isinstance(target, str):
            raise MeshctlError(f"{where}: metadata.target must be an FQN", Exit.USAGE)
        return Manifest(None, target, dict(spec), etag, where)

    kind = require_kind(kind_word)
    return Manifest(_resolve_ref(kind, metadata, where), None, dict(spec), etag, where)


def _resolve_ref(kind: Kind, metadata: Mapping[str, Any], where: str) -> Ref:
    fqn = metadata.get("fqn")
    if isinstance(fqn, str) and fqn:
        ref = parse_fqn(fqn)
        if ref.kind is not kind:
            raise MeshctlError(f"{where}: metadata.fqn names a {ref.kind.name}", Exit.USAGE)
        name = metadata.get("name")
        if name is not None and name != ref.name:
            raise MeshctlError(f"{where}: metadata.name and metadata.fqn disagree", Exit.USAGE)
        return ref
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise MeshctlError(f"{where}: metadata.name is required", Exit.USAGE)
    names = {k: metadata.get(k) for k in parent_keys()}
    bad = [k for k, v in names.items() if v is not None and not isinstance(v, str)]
    if bad:
        raise MeshctlError(f"{where}: metadata.{bad[0]} must be a string", Exit.USAGE)
    try:
        parents = resolve_parents(kind, {k: v for k, v in names.items() if isinstance(v, str)})
    except MeshctlError as exc:
        raise MeshctlError(f"{where}: {exc.message}", Exit.USAGE) from exc
    return Ref(kind, name, parents)


def read_manifests(text: str, source: str) -> Iterator[Manifest]:
    for i, doc in enumerate(load_documents(text, source), start=1):
        yield parse_manifest(doc, f"{source}#{i}")


def to_manifest(kind: Kind, obj: Mapping[str, Any]) -> dict[str, Any]:
    """An API object -> its manifest (the inverse of ``desired_body``)."""
    fqn = obj.get("fqn")
    metadata: dict[str, Any] = {}
    if isinstance(fqn, str) and fqn:
        ref = parse_fqn(fqn)
        metadata["name"] = ref.name
        metadata.update(ref.parent_names())
    metadata.update({k: obj[k] for k in METADATA_FIELDS if k in obj})
    spec = {
        k: v for k, v in obj.items() if k not in METADATA_FIELDS and k not in kind.status_fields
    }
    status = {k: obj[k] for k in kind.status_fields if k in obj}
    doc: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": kind.name,
        "metadata": metadata,
        "spec": spec,
    }
    if status:
        doc["status"] = status
    return doc


def policy_manifest(target: str, policy: Mapping[str, Any]) -> dict[str, Any]:
    metadata: dict[str, Any] = {"target": target}
    if "etag" in policy:
        metadata["etag"] = policy["etag"]
    spec = {k: v for k, v in policy.items() if k not in {"fqn", "etag"}}
    return {"apiVersion": API_VERSION, "kind": POLICY_KIND, "metadata": metadata, "spec": spec}


def desired_body(kind: Kind | None, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The spec as a request body: bookkeeping and server-owned fields dropped."""
    owned = set(METADATA_FIELDS) | (set(kind.status_fields) if kind else set())
    return {k: v for k, v in spec.items() if k not in owned}


def dump(docs: list[dict[str, Any]], fmt: str, *, as_list: bool) -> str:
    """Manifests as multi-document YAML, or JSON (one object, or a ``kind: List``).

    A listing is always a List in JSON, even with zero or one item, so a
    script can rely on ``.items``.
    """
    if fmt == "json":
        value: Any = (
            {"apiVersion": API_VERSION, "kind": "List", "items": docs} if as_list else docs[0]
        )
        return json.dumps(value, indent=2) + "\n"
    if not docs:
        return ""
    return yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False)
