"""Kinds that are Kubernetes manifests: one namespaced object, one compiler model.

BackendTrafficPolicy, HTTPRoute and Backend are stored as the manifests
Envoy Gateway and the Gateway API define (``apiVersion``, ``kind``,
``metadata``, ``spec``), each checked by the strict model the compiler reads
(:mod:`mgmt_api.compiler`). Their REST model's ``spec`` *is* that model's
spec, so the OpenAPI document shows exactly what is accepted, and what the
API accepts is what the compiler can compile. The object is named
``{namespace}.{name}``; ``metadata`` defaults to those two halves and, when
given, must match them. :class:`NamespacedManifestBehaviour` is the one
place these rules live, so the three kinds cannot drift apart.
"""

from __future__ import annotations

from typing import Any

import pydantic
from pydantic import Field

from mgmt_api import fqn as fqnmod
from mgmt_api.errors import invalid
from mgmt_api.kinds.base import Behaviour, Write
from mgmt_api.schemas.base import ApiModel


class ManifestMetadata(ApiModel):
    name: str | None = Field(default=None, description="Default: the {name} of the object name.")
    namespace: str | None = Field(
        default=None, description="Default: the {namespace} of the object name."
    )


def field_path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as the client writes the field: ``.spec.rules[0].name``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


class NamespacedManifestBehaviour(Behaviour):
    """Validate and normalise a namespaced manifest with the compiler's ``manifest`` model.

    ``manifest`` has ``api_version`` and ``kind`` fields whose defaults are
    the manifest's, ``metadata`` and ``spec`` (its type is the REST model's
    ``spec``).
    """

    def __init__(self, manifest: type[pydantic.BaseModel]) -> None:
        self.manifest = manifest
        fields = manifest.model_fields
        self.api_version: str = fields["api_version"].default
        self.kind: str = fields["kind"].default
        self.spec_model: Any = fields["spec"].annotation

    def validate(self, write: Write) -> None:
        """Check with the compiler's model; store what it read.

        Numbers as numbers, addresses and CIDRs normalised, header names
        lower-case: the stored spec is the model's dump (of the fields the
        client set, so defaults are not written back into its manifest), not
        the text as sent. A 400 names the field as the client wrote it
        (``httpRoute.spec.rules[0].backendRefs[0].port``).
        """
        spec, prefix = write.spec, write.prefix
        namespace, short = fqnmod.split_namespaced(write.name)
        metadata = dict(spec.get("metadata") or {})
        metadata.setdefault("namespace", namespace)
        metadata.setdefault("name", short)
        if (metadata["namespace"], metadata["name"]) != (namespace, short):
            raise invalid(
                f"{prefix}.metadata",
                f"namespace/name {metadata['namespace']}/{metadata['name']} "
                f"differ from the object name {write.name!r} ({{namespace}}.{{name}})",
            )
        sent = getattr(write.body, "spec", None)
        doc = {
            "apiVersion": spec.get("apiVersion", self.api_version),
            "kind": spec.get("kind", self.kind),
            "metadata": metadata,
            "spec": sent.model_dump(mode="json", by_alias=True, exclude_unset=True)
            if isinstance(sent, self.spec_model)
            else spec.get("spec"),
        }
        try:
            model = self.manifest.model_validate(doc)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
            raise invalid(prefix + field_path(tuple(first.get("loc", ()))), message) from None
        dump = model.model_dump(mode="json", by_alias=True, exclude_unset=True)
        spec.update(
            apiVersion=doc["apiVersion"], kind=doc["kind"], metadata=metadata, spec=dump["spec"]
        )
