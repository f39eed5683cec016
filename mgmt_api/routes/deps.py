"""Request dependencies: application state, the authenticated call context, path FQNs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Path, Request

from mgmt_api import fqn as fqnmod
from mgmt_api.distribution.hub import Distribution
from mgmt_api.service.authn import Authenticator
from mgmt_api.service.policies import PolicyService
from mgmt_api.service.resources import CallContext, ResourceService
from mgmt_api.settings import Settings


@dataclass
class AppState:
    settings: Settings
    authn: Authenticator
    resources: ResourceService
    policies: PolicyService
    distribution: Distribution | None = field(default=None)


def state(request: Request) -> AppState:
    st: AppState = request.app.state.meshplane
    return st


def client_address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def call_context(request: Request) -> CallContext:
    """Authenticates the request; every route but the public ones depends on it."""
    st = state(request)
    principal = st.authn.authenticate(request.headers.get("authorization"), client_address(request))
    base_url = st.settings.public_url or str(request.base_url)
    return CallContext(principal, base_url)


# A name segment of a path: a DNS-1123 label (mgmt_api.fqn's grammar), or
# ``{namespace}.{name}`` for namespaced kinds. FastAPI checks it before
# authentication, so a malformed name is a 400, never a 404.
Name = Annotated[str, Path(max_length=fqnmod.MAX_NAME, pattern=fqnmod.NAME_PATTERN)]
NamespacedName = Annotated[str, Path(max_length=fqnmod.MAX_NAME, pattern=fqnmod.NAMESPACED_PATTERN)]


def organization_fqn(organization: Name) -> str:
    """``/v2/organizations/{organization}/...`` as the organization's FQN."""
    return fqnmod.organization_fqn(organization)


def cluster_fqn(organization: Name, cluster: Name) -> str:
    """``/v2/organizations/{organization}/clusters/{cluster}/...`` as the cluster's FQN."""
    return fqnmod.cluster_fqn(organization, cluster)


def tenant_fqn(organization: Name, tenant: Name) -> str:
    return fqnmod.tenant_fqn(organization, tenant)


def workspace_fqn(organization: Name, tenant: Name, workspace: Name) -> str:
    return fqnmod.workspace_fqn(organization, tenant, workspace)
