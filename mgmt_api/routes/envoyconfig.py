"""``GET .../clusters/{cluster}/envoyconfig``: the gateway side of the cluster's policies.

The cluster's BackendTrafficPolicies, its gateway knobs (filter timeouts and
failure modes, circuit breakers for the upstream clusters), and the
SecuritySettings (with ``authorization.http.external``) of every security
group that reaches the cluster, rendered by :mod:`mgmt_api.compiler.envoy_config`
from the same read model the extauthz and ratelimit snapshots come from
(:mod:`mgmt_api.service.enforcement`), so the context extensions Envoy sends
name the policies the cluster's ext_authz instances load. Needs READ on the
cluster. It is for people to read: key material (a local JWT provider's
inline JWKS with an HMAC or private key) shows as its fingerprint marker
(:func:`mgmt_api.compiler.key_material.redact_envoy_config`), in every format;
the gateways get the real keys over ADS.

``?format=yaml`` returns the same document as YAML; ``?rateLimitService=
grpc://host:port`` says where the gateway reaches the ratelimit service (the
management plane does not know; default ``grpc://ratelimit:8081``).
"""

from __future__ import annotations

from typing import Annotated, Literal

import yaml
from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response

from meshplane.kinds_contract import Kind
from mgmt_api.compiler import envoy_config
from mgmt_api.routes.deps import Ctx, Enforcement, Name

router = APIRouter()


@router.get(
    "/v2/organizations/{organization}/clusters/{cluster}/envoyconfig",
    tags=[Kind.CLUSTER],
    operation_id="GetClusterEnvoyConfig",
    summary="Envoy HTTP filters, per-route settings and clusters enforcing the cluster's policies",
    response_model=None,
    responses={
        200: {
            "description": "The cluster's Envoy config (docs/api.md, Envoy config for a cluster)",
            "content": {"application/json": {}, "application/yaml": {}},
        }
    },
)
def cluster_envoy_config(
    ctx: Ctx,
    organization: Name,
    cluster: Name,
    enforcement: Enforcement,
    *,
    output: Annotated[Literal["json", "yaml"], Query(alias="format")] = "json",
    ratelimit_service: Annotated[
        str, Query(alias="rateLimitService", max_length=300)
    ] = envoy_config.DEFAULT_RATELIMIT_SERVICE,
) -> Response:
    document = enforcement.envoy_config(ctx, organization, cluster, ratelimit_service)
    if output == "yaml":
        body = yaml.safe_dump(document, sort_keys=False, default_flow_style=False)
        return Response(body, media_type="application/yaml")
    return JSONResponse(document)
