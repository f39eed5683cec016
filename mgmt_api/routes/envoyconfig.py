"""``GET .../clusters/{cluster}/envoyconfig``: the gateway side of the cluster's policies.

Reads, in one transaction, the cluster's BackendTrafficPolicies, its
rate-limit failure mode, and the SecuritySettings (with
``authorization.http.external``) of every security group that reaches the
cluster, and renders them with :mod:`mgmt_api.compiler.envoy_config`. Groups
are selected exactly as for the extauthz snapshot
(:mod:`mgmt_api.distribution.store_backend`), and policies are named by the
same functions, so the context extensions Envoy sends name the policies the
cluster's ext_authz instances load. Needs READ on the cluster.

``?format=yaml`` returns the same document as YAML; ``?rateLimitService=
grpc://host:port`` says where the gateway reaches the ratelimit service (the
management plane does not know; default ``grpc://ratelimit:8081``).
"""

from __future__ import annotations

from typing import Annotated, Literal

import yaml
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from sqlalchemy.engine import Connection

from mgmt_api.compiler import envoy_config
from mgmt_api.compiler import extauthz as extauthz_compiler
from mgmt_api.distribution.selection import children, groups_reaching, selected_namespaces
from mgmt_api.distribution.store_backend import traffic_policies
from mgmt_api.domain import rbac
from mgmt_api.errors import not_found
from mgmt_api.fqn import cluster_fqn
from mgmt_api.routes.deps import Name, call_context, state
from mgmt_api.service import authz
from mgmt_api.service.resources import CallContext
from mgmt_api.service.validation import check_grpc_uri
from mgmt_api.store import repo
from mgmt_api.store.engine import read_tx

router = APIRouter()
Ctx = Annotated[CallContext, Depends(call_context)]


def _ext_authz_routes(
    conn: Connection, organization: str, cluster: str
) -> tuple[list[envoy_config.ExtAuthzRoute], list[str]]:
    routes: list[envoy_config.ExtAuthzRoute] = []
    notes: list[str] = []
    for reach in groups_reaching(conn, organization, cluster):
        group = reach.group
        for setting in children(conn, group.fqn, "SecuritySetting"):
            authorization = setting.spec.get("authorization") or {}
            external = (authorization.get("http") or {}).get("external")
            disabled = authorization.get("mode") == "DISABLED"
            if external is None and not disabled:
                continue
            policy = (external or {}).get("policy")
            if policy and not repo.exists(conn, f"{group.fqn}/extauthzpolicies/{policy}"):
                notes.append(
                    f"{setting.fqn} selects ExtAuthzPolicy {policy!r}, which does not "
                    "exist in its group: ext_authz denies its requests"
                )
            routes.append(
                envoy_config.ExtAuthzRoute(
                    setting=setting.fqn,
                    group=group.fqn,
                    namespaces=selected_namespaces(reach.selector, cluster),
                    uri=(external or {}).get("uri", ""),
                    policy=extauthz_compiler.policy_name(group.fqn, policy) if policy else None,
                    disabled=disabled,
                )
            )
    return routes, notes


def gather(
    conn: Connection, organization: str, cluster: str, ratelimit_service: str
) -> envoy_config.ClusterPolicies:
    """What :func:`envoy_config.render` needs, read from the store."""
    fqn = cluster_fqn(organization, cluster)
    resource = repo.get(conn, fqn)
    if resource is None:
        raise not_found(fqn)
    failure_mode = (resource.spec.get("rateLimit") or {}).get("failureMode")
    policies = [
        (f"{fqn}/backendtrafficpolicies/{p.metadata.namespace}.{p.metadata.name}", p)
        for p in traffic_policies(conn, organization, cluster)
    ]
    ext_authz, notes = _ext_authz_routes(conn, organization, cluster)
    return envoy_config.ClusterPolicies(
        cluster_fqn=fqn,
        cluster=cluster,
        failure_mode=failure_mode,
        traffic_policies=tuple(policies),
        ext_authz=tuple(ext_authz),
        ratelimit_service=ratelimit_service,
        notes=tuple(notes),
    )


@router.get(
    "/v2/organizations/{organization}/clusters/{cluster}/envoyconfig",
    tags=["Cluster"],
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
    request: Request,
    ctx: Ctx,
    organization: Name,
    cluster: Name,
    *,
    output: Annotated[Literal["json", "yaml"], Query(alias="format")] = "json",
    ratelimit_service: Annotated[
        str, Query(alias="rateLimitService", max_length=300)
    ] = envoy_config.DEFAULT_RATELIMIT_SERVICE,
) -> Response:
    check_grpc_uri("rateLimitService", ratelimit_service)
    fqn = cluster_fqn(organization, cluster)
    with read_tx(state(request).resources.engine) as conn:
        authz.require(conn, ctx.principal, fqn, "Cluster", rbac.READ)
        document = envoy_config.render(gather(conn, organization, cluster, ratelimit_service))
    if output == "yaml":
        body = yaml.safe_dump(document, sort_keys=False, default_flow_style=False)
        return Response(body, media_type="application/yaml")
    return JSONResponse(document)
