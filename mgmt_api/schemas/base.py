"""Base model: camelCase aliases, unknown fields rejected (400, naming the field)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class ErrorBody(ApiModel):
    """google.rpc.Status: the body of every error response."""

    code: int = Field(description="gRPC status code number (3 INVALID_ARGUMENT, 5 NOT_FOUND, ...)")
    message: str
    details: list[dict[str, Any]] = Field(default_factory=list)


class Empty(ApiModel):
    """Operations with no result return an empty JSON object."""
