"""HTTPRoute: a Gateway API route of a cluster's gateways (``gateway.networking.k8s.io/v1``).

A namespaced manifest (:mod:`mgmt_api.kinds.manifest`) whose ``spec`` is the
compiler's :class:`mgmt_api.compiler.http_route.HTTPRouteSpec`: the subset
the gateway's xDS is rendered from. BackendTrafficPolicies target a route by
``{kind: HTTPRoute, name}`` in its namespace; SecuritySettings apply to it
through the namespace their workspace selects.
"""

from __future__ import annotations

from typing import Literal

from meshplane.kinds_contract import Kind
from mgmt_api.compiler import http_route as hr
from mgmt_api.kinds.base import KindDef
from mgmt_api.kinds.manifest import ManifestMetadata, NamespacedManifestBehaviour
from mgmt_api.schemas.resources import Meta


class HTTPRoute(Meta):
    """Gateway API's HTTPRoute (``gateway.networking.k8s.io/v1``), the subset gateways serve."""

    api_version: Literal["gateway.networking.k8s.io/v1"] | None = None
    kind: Literal["HTTPRoute"] | None = None
    metadata: ManifestMetadata | None = None
    spec: hr.HTTPRouteSpec


KIND = KindDef(Kind.HTTP_ROUTE, HTTPRoute, behaviour=NamespacedManifestBehaviour(hr.HTTPRoute))
