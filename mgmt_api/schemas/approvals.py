"""Approval request and response bodies (docs/api.md, "Approvals")."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from mgmt_api.schemas.base import ApiModel
from mgmt_api.schemas.resources import RoleRule

ApprovalMode = Literal["UNRESTRICTED", "ALLOW_REQUESTED", "REQUIRE_APPROVAL"]


def _subject() -> Any:
    return Field(
        min_length=1,
        max_length=512,
        description="FQN of who asks for access (an application, user, team or service account).",
    )


def _resource() -> Any:
    return Field(
        default=None,
        max_length=512,
        description="FQN of the resource; optional, must be the path's resource when given.",
    )


class Access(ApiModel):
    subject: str = _subject()
    permissions: list[str] = Field(
        min_length=1, max_length=100, description="What is granted, e.g. HTTP verbs GET, POST."
    )


class ApprovalDetails(ApiModel):
    name: str | None = Field(default=None, max_length=256)
    description: str | None = Field(default=None, max_length=4096)


class ApprovalMetadata(ApiModel):
    details: ApprovalDetails | None = None
    rules: list[RoleRule] | None = None


class ApprovalPolicy(ApiModel):
    """GetPolicy's and QueryPolicies' answer."""

    resource: str | None = _resource()
    mode: ApprovalMode
    requested: list[Access] | None = None
    approved: list[Access] | None = None
    metadata: ApprovalMetadata | None = None
    etag: str | None = None
    create_time: str | None = None
    update_time: str | None = None
    allowed_operations: list[str] | None = Field(
        default=None, description="QueryPolicies with includePermissions."
    )


LISTS_REFUSED = (
    "not accepted on SetPolicy, which sets only the mode and metadata: change the lists "
    "with requested:add, requested:approve, requested:delete, approved:add and "
    "approved:delete, which each need their own permission and are audited per subject"
)


class SetApprovalPolicyRequest(ApiModel):
    """SetPolicy's body: the mode and metadata; the lists are kept as they are."""

    resource: str | None = _resource()
    mode: ApprovalMode
    metadata: ApprovalMetadata | None = None
    etag: str | None = Field(
        default=None, description="Optional; when given, must be the current one."
    )
    # Declared so the refusal can name the operations to use instead of a bare
    # "unknown field". Any value, even [], is a 400: granting or revoking
    # through SetPolicy would bypass those operations' permissions and audit.
    requested: list[Access] | None = Field(default=None, description=f"Refused: {LISTS_REFUSED}.")
    approved: list[Access] | None = Field(default=None, description=f"Refused: {LISTS_REFUSED}.")
    create_time: str | None = Field(default=None, description="Output only; ignored.")
    update_time: str | None = Field(default=None, description="Output only; ignored.")


class AccessRequest(ApiModel):
    """Body of ``requested:add``, ``requested:approve`` and ``approved:add``."""

    resource: str | None = _resource()
    access: Access


class ResourceAndSubject(ApiModel):
    """Body of ``requested:delete`` and ``approved:delete``."""

    resource: str | None = _resource()
    subject: str = _subject()


class QueryPoliciesRequest(ApiModel):
    parent: str | None = _resource()
    types: list[Literal["Organization", "Cluster"]] = Field(
        default_factory=list, description="Kinds of resource to include; empty means all."
    )
    include_details: bool = Field(default=False, description="Include the lists and metadata.")
    include_permissions: bool = Field(
        default=False, description="Include the approval operations the caller may perform."
    )


class QueryPoliciesResponse(ApiModel):
    policies: list[ApprovalPolicy]


class AccessCheckRequest(ApiModel):
    subject: str = _subject()
    permission: str = Field(min_length=1, max_length=100)


class AccessCheckResponse(ApiModel):
    allowed: bool
    mode: ApprovalMode
    reason: str
