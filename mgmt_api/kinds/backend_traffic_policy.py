"""BackendTrafficPolicy: Envoy Gateway's global rate-limit policy, per cluster.

The REST model's ``spec`` *is* the compiler's strict model
(:class:`mgmt_api.compiler.traffic_policy.BackendTrafficPolicySpec`), so the
OpenAPI document shows exactly what is accepted, and what the API accepts is
what the compiler can compile. The object is named ``{namespace}.{name}``;
``metadata`` defaults to those two halves and, when given, must match them.
"""

from __future__ import annotations

from typing import Literal

import pydantic
from pydantic import Field

from mgmt_api import fqn as fqnmod
from mgmt_api.compiler import traffic_policy as tp
from mgmt_api.errors import invalid
from mgmt_api.kinds.base import Behaviour, KindDef, Write
from mgmt_api.schemas.base import ApiModel
from mgmt_api.schemas.resources import Meta


class PolicyMetadata(ApiModel):
    name: str | None = Field(default=None, description="Default: the {name} of the object name.")
    namespace: str | None = Field(
        default=None, description="Default: the {namespace} of the object name."
    )


class BackendTrafficPolicy(Meta):
    """Envoy Gateway's BackendTrafficPolicy (``gateway.envoyproxy.io/v1alpha1``)."""

    api_version: Literal["gateway.envoyproxy.io/v1alpha1"] | None = None
    kind: Literal["BackendTrafficPolicy"] | None = None
    metadata: PolicyMetadata | None = None
    spec: tp.BackendTrafficPolicySpec


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


class BackendTrafficPolicyBehaviour(Behaviour):
    def validate(self, write: Write) -> None:
        """Check with the compiler's model; store what it read.

        Numbers as numbers, header names lower-case, CIDRs normalised, costs in
        Envoy Gateway's shape: the stored spec is the model's dump, not the
        text as sent.
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
            "apiVersion": spec.get("apiVersion", tp.API_VERSION),
            "kind": spec.get("kind", tp.KIND),
            "metadata": metadata,
            "spec": sent.model_dump(mode="json", by_alias=True, exclude_unset=True)
            if isinstance(sent, tp.BackendTrafficPolicySpec)
            else spec.get("spec"),
        }
        try:
            model = tp.BackendTrafficPolicy.model_validate(doc)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
            raise invalid(prefix + _loc(tuple(first.get("loc", ()))), message) from None
        spec.update(
            apiVersion=doc["apiVersion"],
            kind=doc["kind"],
            metadata=metadata,
            spec=model.spec.model_dump(mode="json", by_alias=True, exclude_unset=True),
        )


KIND = KindDef(
    "BackendTrafficPolicy",
    "backendtrafficpolicies",
    "backendtrafficpolicy",
    "backendTrafficPolicy",
    "backendTrafficPolicies",
    BackendTrafficPolicy,
    ("Cluster",),
    behaviour=BackendTrafficPolicyBehaviour(),
)
