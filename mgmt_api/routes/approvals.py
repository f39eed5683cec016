"""Approvals for an organization and for a cluster, plus the access check (docs/api.md).

Both variants share one set of handlers; only the dependency that turns the
path into the resource FQN differs.
"""

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query

from meshplane.kinds_contract import Kind
from mgmt_api.domain import approvals as ap
from mgmt_api.errors import invalid
from mgmt_api.routes.deps import Approvals, Ctx, FqnOf, cluster_fqn, organization_fqn
from mgmt_api.schemas import approvals as s
from mgmt_api.schemas.base import ApiModel, Empty, QueryBool
from mgmt_api.service.approvals import TRANSITIONS, same_resource

router = APIRouter()


def _access(body: s.AccessRequest, resource: str) -> ap.Access:
    same_resource(body.resource, resource, "resource")
    return ap.access(body.access.subject, body.access.permissions)


# Path suffix -> (operation name, summary).
TRANSITION_ROUTES = {
    "approved:add": ("AddApprovedAccess", "Grant access directly"),
    "approved:delete": ("DeleteApprovedAccess", "Revoke an approved access"),
    "requested:add": ("AddAccessRequest", "Ask for access; granted at once in ALLOW_REQUESTED"),
    "requested:approve": ("ApproveAccessRequest", "Approve a pending request (these permissions)"),
    "requested:delete": ("DeleteAccessRequest", "Withdraw a pending request; 404 once approved"),
}


def _transition_endpoint(name: str, resource_type: Any) -> Callable[..., Any]:
    """The handler of one state-table transition; the deletes take only a subject."""
    doc = f"{TRANSITION_ROUTES[name][1]} ({TRANSITIONS[name].operation.name})."
    if name.endswith(":delete"):

        def by_subject(
            approvals: Approvals,
            ctx: Ctx,
            resource: resource_type,
            body: Annotated[s.ResourceAndSubject, Body()],
        ) -> Empty:
            same_resource(body.resource, resource, "resource")
            approvals.transition(ctx, resource, name, ap.access(body.subject, ()))
            return Empty()

        by_subject.__doc__ = doc
        return by_subject

    def with_access(
        approvals: Approvals,
        ctx: Ctx,
        resource: resource_type,
        body: Annotated[s.AccessRequest, Body()],
    ) -> Empty:
        approvals.transition(ctx, resource, name, _access(body, resource))
        return Empty()

    with_access.__doc__ = doc
    return with_access


#: Path suffix, method, endpoint, operation name and response model of one route.
_Route = tuple[str, str, Callable[..., Any], str, type[ApiModel]]


def _policy_routes(resource_type: Any) -> list[_Route]:
    """Read, set and delete the approval policy of a ``resource_type``."""

    def get_policy(approvals: Approvals, ctx: Ctx, resource: resource_type) -> s.ApprovalPolicy:
        """The approval policy (ReadApprovalPolicy)."""
        return approvals.get(ctx, resource)

    def set_policy(
        approvals: Approvals,
        ctx: Ctx,
        resource: resource_type,
        body: Annotated[s.SetApprovalPolicyRequest, Body()],
    ) -> Empty:
        """Enable checks, setting the mode and metadata (Create/WriteApprovalPolicy)."""
        same_resource(body.resource, resource, "resource")
        for field in ("requested", "approved"):
            if getattr(body, field) is not None:
                raise invalid(field, s.LISTS_REFUSED)
        approvals.set_policy(
            ctx,
            resource,
            ap.Mode(body.mode),
            metadata=body.metadata.model_dump(by_alias=True, exclude_none=True, mode="json")
            if body.metadata
            else None,
            etag=body.etag,
        )
        return Empty()

    def delete_policy(
        approvals: Approvals,
        ctx: Ctx,
        resource: resource_type,
        force: Annotated[
            QueryBool, Query(description="Accepted; no protected internals exist.")
        ] = False,
    ) -> Empty:
        """Stop checks and revoke every approval (DeleteApprovalPolicy)."""
        approvals.delete_policy(ctx, resource, force=force)
        return Empty()

    return [
        ("", "GET", get_policy, "GetPolicy", s.ApprovalPolicy),
        ("", "POST", set_policy, "SetPolicy", Empty),
        ("", "DELETE", delete_policy, "DeletePolicy", Empty),
    ]


def _query_routes(resource_type: Any) -> list[_Route]:
    """Query the policies under a ``resource_type`` and check a subject's access there."""

    def query(
        approvals: Approvals,
        ctx: Ctx,
        resource: resource_type,
        body: Annotated[s.QueryPoliciesRequest, Body()],
    ) -> s.QueryPoliciesResponse:
        """Approval policies here and (for an organization) on its clusters (ReadApprovalPolicy)."""
        same_resource(body.parent, resource, "parent")
        policies = approvals.query(
            ctx,
            resource,
            types=list(body.types),
            details=body.include_details,
            permissions=body.include_permissions,
        )
        return s.QueryPoliciesResponse(policies=policies)

    def check(
        approvals: Approvals,
        ctx: Ctx,
        resource: resource_type,
        body: Annotated[s.AccessCheckRequest, Body()],
    ) -> s.AccessCheckResponse:
        """Is the subject allowed the permission? (CheckApprovalPolicyAccess)"""
        return approvals.check(ctx, resource, body.subject, body.permission)

    return [
        ("/query", "POST", query, "QueryPolicies", s.QueryPoliciesResponse),
        (":check", "POST", check, "CheckAccess", s.AccessCheckResponse),
    ]


def _add_variant(prefix: str, resource_of: FqnOf, variant: str) -> None:
    """The approval routes under ``prefix``, the resource named by ``resource_of``."""
    Resource = Annotated[str, Depends(resource_of)]
    routes = [*_policy_routes(Resource), *_query_routes(Resource)]
    routes += [
        (f"/{name}", "POST", _transition_endpoint(name, Resource), op, Empty)
        for name, (op, _) in TRANSITION_ROUTES.items()
    ]
    for suffix, method, fn, op, model in routes:
        router.add_api_route(
            prefix + suffix,
            fn,
            methods=[method],
            operation_id=f"{variant}Approvals_{op}",
            tags=["Approvals"],
            summary=(fn.__doc__ or "").strip().splitlines()[0],
            response_model=model,
            response_model_exclude_none=True,
        )


_add_variant("/v2/organizations/{organization}/approvals", organization_fqn, Kind.ORGANIZATION)
_add_variant(
    "/v2/organizations/{organization}/clusters/{cluster}/approvals", cluster_fqn, Kind.CLUSTER
)
