"""Base model: camelCase aliases; unknown fields and wrong JSON types rejected.

``strict``: a JSON value must already have the field's type. ``"yes"``,
``"true"`` or ``1`` for a boolean, ``"3"`` or ``3.0`` for an integer, are
refused with a 400 naming the field, never coerced: a coerced ``apply: "yes"``
once ran a cleanup, and ``deletionProtectionEnabled: "yes"`` protected
nothing anyone meant to. (An integer is accepted for a float.)

Query parameters are text, so their booleans get the same rule by their own
type, :data:`QueryBool`: ``true`` or ``false``, nothing else.

The OpenAPI document is generated from these models, so each rule the server
enforces is stated here once and published from here: name patterns
(:data:`DnsLabel`, :data:`NamespacedName`), the etag an update needs
(:func:`with_required_etag`), and the ban on control characters in request
strings (:data:`CONTROL_CHARACTERS`, enforced on the raw body by
:mod:`mgmt_api.middleware`, shown as each input string's ``pattern``).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    create_model,
)
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from mgmt_api import fqn as fqnmod

#: What no string of a request body may hold: C0 controls but tab, line feed
#: and carriage return, and DEL. Never meaningful in a name, label or
#: description, and a classic smuggling vector (NUL truncates in C consumers,
#: escape sequences rewrite terminals). A regex character range, in the
#: syntax Python and ECMA-262 (JSON Schema's) share.
CONTROL_CHARACTERS = r"\x00-\x08\x0b\x0c\x0e-\x1f\x7f"
#: A string without :data:`CONTROL_CHARACTERS`.
TEXT_PATTERN = f"^[^{CONTROL_CHARACTERS}]*$"

#: A DNS-1123 label: an object's name segment, a namespace.
DnsLabel = Annotated[str, Field(max_length=fqnmod.MAX_NAME, pattern=fqnmod.NAME_PATTERN)]
#: ``{namespace}.{name}``: the name segment of a namespaced kind.
NamespacedName = Annotated[
    str, Field(max_length=fqnmod.MAX_NAME, pattern=fqnmod.NAMESPACED_PATTERN)
]

#: A role's FQN: ``rbac/`` and a DNS-1123 label (``rbac/admin``).
ROLE_PATTERN = f"^{fqnmod.RBAC}/{fqnmod.NAME_PATTERN[1:]}"

#: What each published pattern means, for the 400 of a value that misses it.
PATTERN_RULES = {
    fqnmod.NAME_PATTERN: "must be a DNS-1123 label (lower-case letters, digits and '-', "
    "starting and ending with a letter or digit)",
    fqnmod.NAMESPACED_PATTERN: "must be {namespace}.{name}, two DNS-1123 labels",
    TEXT_PATTERN: "must not contain control characters",
    ROLE_PATTERN: "must be a role: rbac/ and its name (rbac/admin, rbac/editor, ...)",
}


class ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", strict=True
    )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """As pydantic's, with the ban on control characters in each input string."""
        schema = handler(core_schema)
        if handler.mode == "validation":
            _ban_controls(handler.resolve_ref_schema(schema))
        return schema


def _ban_controls(node: dict[str, Any]) -> None:
    """Give every string of this schema (not of the models it refers to: they do
    their own) and every map key the :data:`TEXT_PATTERN`, unless it is more
    narrowly constrained already."""
    if node.get("type") == "string" and not node.keys() & {"pattern", "enum", "const"}:
        node["pattern"] = TEXT_PATTERN
    if node.get("type") == "object" and node.get("additionalProperties", False) is not False:
        node.setdefault("propertyNames", {"pattern": TEXT_PATTERN})
    children = [node.get("items"), node.get("additionalProperties")]
    children += list((node.get("properties") or {}).values())
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        children += node.get(key) or []
    for child in children:
        if isinstance(child, dict):
            _ban_controls(child)


#: The etag an update sends back: required, so that a PUT never overwrites a
#: change its client did not see (a stale one gets 409 ABORTED).
RequiredEtag = Annotated[
    str, Field(min_length=1, max_length=128, description="The etag last read; required.")
]


def with_required_etag(model: type[ApiModel], name: str) -> type[ApiModel]:
    """``model`` as the body of a PUT: the same fields, with :data:`RequiredEtag`."""
    fields: dict[str, Any] = {"etag": (RequiredEtag, ...)}
    return create_model(name, __base__=model, **fields)


class ErrorBody(ApiModel):
    """google.rpc.Status: the body of every error response."""

    code: int = Field(description="gRPC status code number (3 INVALID_ARGUMENT, 5 NOT_FOUND, ...)")
    message: str
    details: list[dict[str, Any]] = Field(default_factory=list)


class Empty(ApiModel):
    """Operations with no result return an empty JSON object."""


def _query_bool(value: object) -> bool:
    """``true`` -> True, ``false`` -> False; anything else is refused, never guessed."""
    if isinstance(value, bool):  # the parameter's default
        return value
    if value == "true":
        return True
    if value == "false":
        return False
    shown = str(value)[:32]
    raise ValueError(f"must be true or false, not {shown!r}")


#: Every boolean query parameter (``force``, ``fetchWorkloads``,
#: ``includeInstallTemplate``, ...). Pydantic would read ``yes``, ``on`` or
#: ``1`` as true: ``DELETE /v2/organizations/x?force=yes`` once deleted a
#: deletion-protected organization. The OpenAPI shows a plain boolean.
QueryBool = Annotated[bool, BeforeValidator(_query_bool)]
