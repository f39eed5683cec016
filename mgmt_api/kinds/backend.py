"""Backend: Envoy Gateway's upstream by address (``gateway.envoyproxy.io/v1alpha1``).

An HTTPRoute's ``backendRefs`` entry ``{group: gateway.envoyproxy.io, kind:
Backend, name}`` sends traffic to the endpoints of the Backend of that name
in the route's namespace (or the ref's ``namespace``): IP addresses or DNS
names with ports, for upstreams that are no Kubernetes Service. A namespaced
manifest (:mod:`mgmt_api.kinds.manifest`) whose ``spec`` is the compiler's
:class:`mgmt_api.compiler.http_route.BackendSpec`.
"""

from __future__ import annotations

from typing import Literal

from meshplane.kinds_contract import Kind
from mgmt_api.compiler import http_route as hr
from mgmt_api.kinds.base import KindDef
from mgmt_api.kinds.manifest import ManifestMetadata, NamespacedManifestBehaviour
from mgmt_api.schemas.resources import Meta


class Backend(Meta):
    """Envoy Gateway's Backend (``gateway.envoyproxy.io/v1alpha1``): ip or fqdn endpoints."""

    api_version: Literal["gateway.envoyproxy.io/v1alpha1"] | None = None
    kind: Literal["Backend"] | None = None
    metadata: ManifestMetadata | None = None
    spec: hr.BackendSpec


KIND = KindDef(Kind.BACKEND, Backend, behaviour=NamespacedManifestBehaviour(hr.Backend))
