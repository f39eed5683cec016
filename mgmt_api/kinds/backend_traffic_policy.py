"""BackendTrafficPolicy: Envoy Gateway's global rate-limit policy, per cluster.

A namespaced manifest (:mod:`mgmt_api.kinds.manifest`): the REST model's
``spec`` *is* the compiler's strict model
(:class:`mgmt_api.compiler.traffic_policy.BackendTrafficPolicySpec`), and the
object is named ``{namespace}.{name}``. Its ``targetRef`` names an HTTPRoute
(or Gateway) of the same cluster and namespace.
"""

from __future__ import annotations

from typing import Literal

from meshplane.kinds_contract import Kind
from mgmt_api.compiler import traffic_policy as tp
from mgmt_api.kinds.base import KindDef
from mgmt_api.kinds.manifest import ManifestMetadata, NamespacedManifestBehaviour
from mgmt_api.schemas.resources import Meta


class BackendTrafficPolicy(Meta):
    """Envoy Gateway's BackendTrafficPolicy (``gateway.envoyproxy.io/v1alpha1``)."""

    api_version: Literal["gateway.envoyproxy.io/v1alpha1"] | None = None
    kind: Literal["BackendTrafficPolicy"] | None = None
    metadata: ManifestMetadata | None = None
    spec: tp.BackendTrafficPolicySpec


KIND = KindDef(
    Kind.BACKEND_TRAFFIC_POLICY,
    BackendTrafficPolicy,
    behaviour=NamespacedManifestBehaviour(tp.BackendTrafficPolicy),
)
