"""Base model: camelCase aliases; unknown fields and wrong JSON types rejected.

``strict``: a JSON value must already have the field's type. ``"yes"``,
``"true"`` or ``1`` for a boolean, ``"3"`` or ``3.0`` for an integer, are
refused with a 400 naming the field, never coerced: a coerced ``apply: "yes"``
once ran a cleanup, and ``deletionProtectionEnabled: "yes"`` protected
nothing anyone meant to. (An integer is accepted for a float.)

Query parameters are text, so their booleans get the same rule by their own
type, :data:`QueryBool`: ``true`` or ``false``, nothing else.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", strict=True
    )


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
