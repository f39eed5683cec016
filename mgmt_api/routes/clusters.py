"""``POST .../clusters/{cluster}/config``: what a cluster's control plane syncs.

The response is the cluster's effective settings (profiles' defaults and
mandates applied), see :mod:`mgmt_api.service.clusters`.
"""

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response

from meshplane.kinds_contract import Kind
from mgmt_api.kinds import item_templates
from mgmt_api.routes import templated as t
from mgmt_api.routes.deps import call_context, services
from mgmt_api.schemas import resources as m


def _add(router: APIRouter, tpl: str) -> None:
    Cluster = Annotated[t.ObjectRef, Depends(t.path_ref(tpl))]

    def config(request: Request, cluster: Cluster) -> Response:
        found = services(request).clusters.config(call_context(request), cluster.fqn)
        return t.json_response(found)

    t.Mount(router, "/v2/" + tpl, Kind.CLUSTER).add(
        "/config",
        "POST",
        config,
        name="GetClusterConfig",
        model=m.ClusterConfig,
        summary="ClusterConfig: the effective settings the cluster's control plane syncs",
    )


def add_routes(router: APIRouter) -> None:
    for tpl in item_templates(Kind.CLUSTER):
        _add(router, tpl)
