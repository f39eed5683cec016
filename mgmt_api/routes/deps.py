"""Request dependencies: application state and the authenticated call context."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import Request

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
