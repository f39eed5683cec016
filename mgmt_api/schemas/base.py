"""Base model: camelCase aliases; unknown fields and wrong JSON types rejected.

``strict``: a JSON value must already have the field's type. ``"yes"``,
``"true"`` or ``1`` for a boolean, ``"3"`` or ``3.0`` for an integer, are
refused with a 400 naming the field, never coerced: a coerced ``apply: "yes"``
once ran a cleanup, and ``deletionProtectionEnabled: "yes"`` protected
nothing anyone meant to. (An integer is accepted for a float.)
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
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
