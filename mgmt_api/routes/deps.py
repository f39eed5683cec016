"""Request dependencies: the services, the authenticated call context, path names.

Services are built once per app (:class:`mgmt_api.service.container.Services`)
and reach routes as ``Annotated`` dependencies (``resources: Resources``).
The getters are ``async`` on purpose: FastAPI runs a sync dependency in the
thread pool, a hop per request for what is an attribute read. So are the
path-to-FQN dependencies.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, Path, Request
from starlette.types import Scope

from mgmt_api import fqn as fqnmod
from mgmt_api.access import CallContext
from mgmt_api.service.approvals import ApprovalService
from mgmt_api.service.audit import AuditService
from mgmt_api.service.cleanup import CleanupService
from mgmt_api.service.container import Services
from mgmt_api.service.enforcement import EnforcementService
from mgmt_api.service.inventory import InventoryService
from mgmt_api.service.mesh_ca import MeshCaStore
from mgmt_api.service.onboarding import OnboardingService
from mgmt_api.service.profiles import ProfileService
from mgmt_api.service.status import StatusService
from mgmt_api.service.workloads import WorkloadService


def services(request: Request) -> Services:
    found: Services = request.app.state.services
    return found


def client_address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


#: Where :func:`authenticate_scope` leaves a request's call context.
_CONTEXT = "meshplane.call_context"


def authenticate_scope(scope: Scope) -> None:
    """Authenticate a request and keep its context in the ASGI scope.

    :class:`mgmt_api.middleware.Authenticate` calls it for every request
    under ``/v2/`` but the public ones, before path, query or body are read.
    """
    scope[_CONTEXT] = _authenticate(Request(scope))


def call_context(request: Request) -> CallContext:
    """The authenticated caller; every route but the public ones depends on it.

    Under ``/v2/`` the middleware authenticated it already; other paths that
    need credentials (``/metrics``) authenticate here.
    """
    found = request.scope.get(_CONTEXT)
    return found if isinstance(found, CallContext) else _authenticate(request)


def _authenticate(request: Request) -> CallContext:
    svc = services(request)
    principal = svc.authn.authenticate(
        request.headers.get("authorization"), client_address(request)
    )
    base_url = svc.settings.public_url or str(request.base_url)
    return CallContext(principal, base_url)


Ctx = Annotated[CallContext, Depends(call_context)]


def _service(attribute: str) -> Callable[[Request], Awaitable[Any]]:
    """A dependency returning one service of the app's container."""

    async def get(request: Request) -> Any:
        return getattr(services(request), attribute)

    get.__name__ = attribute
    return get


Approvals = Annotated[ApprovalService, Depends(_service("approvals"))]
Audit = Annotated[AuditService, Depends(_service("audit"))]
Cleanup = Annotated[CleanupService, Depends(_service("cleanup"))]
Enforcement = Annotated[EnforcementService, Depends(_service("enforcement"))]
Inventory = Annotated[InventoryService, Depends(_service("inventory"))]
Onboarding = Annotated[OnboardingService, Depends(_service("onboarding"))]
Profiles = Annotated[ProfileService, Depends(_service("profiles"))]
Status = Annotated[StatusService, Depends(_service("status"))]
MeshCas = Annotated[MeshCaStore, Depends(_service("mesh_ca"))]
Workloads = Annotated[WorkloadService, Depends(_service("workloads"))]

#: A dependency that turns path parameters into an FQN.
FqnOf = Callable[..., Awaitable[str]]

# A name segment of a path: a DNS-1123 label (mgmt_api.fqn's grammar), or
# ``{namespace}.{name}`` for namespaced kinds. FastAPI checks it before the
# route runs, so a malformed name is a 400, never a 404 (after authentication:
# an anonymous caller gets 401 whatever the path).
Name = Annotated[str, Path(max_length=fqnmod.MAX_NAME, pattern=fqnmod.NAME_PATTERN)]
NamespacedName = Annotated[str, Path(max_length=fqnmod.MAX_NAME, pattern=fqnmod.NAMESPACED_PATTERN)]


async def organization_fqn(organization: Name) -> str:
    """``/v2/organizations/{organization}/...`` as the organization's FQN."""
    return fqnmod.organization_fqn(organization)


async def cluster_fqn(organization: Name, cluster: Name) -> str:
    """``/v2/organizations/{organization}/clusters/{cluster}/...`` as the cluster's FQN."""
    return fqnmod.cluster_fqn(organization, cluster)


async def tenant_fqn(organization: Name, tenant: Name) -> str:
    return fqnmod.tenant_fqn(organization, tenant)


async def workspace_fqn(organization: Name, tenant: Name, workspace: Name) -> str:
    return fqnmod.workspace_fqn(organization, tenant, workspace)


async def security_group_fqn(organization: Name, tenant: Name, workspace: Name, group: Name) -> str:
    return fqnmod.security_group_fqn(organization, tenant, workspace, group)


OrganizationFqn = Annotated[str, Depends(organization_fqn)]
SecurityGroupFqn = Annotated[str, Depends(security_group_fqn)]
ClusterFqn = Annotated[str, Depends(cluster_fqn)]
