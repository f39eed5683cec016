"""``POST .../clusters/{cluster}/config``: what a cluster's control plane syncs.

The response is the cluster's effective settings (profiles' defaults and
mandates applied), see :mod:`mgmt_api.service.clusters`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from mgmt_api.kinds import item_templates
from mgmt_api.routes.deps import services
from mgmt_api.routes.templated import (
    endpoint,
    fill,
    json_response,
    operation_id,
    params_of,
    signature,
)
from mgmt_api.schemas import resources as m


def _add(router: APIRouter, tpl: str) -> None:
    path = "/v2/" + tpl

    def config(**kw: Any) -> Response:
        return json_response(services(kw["request"]).clusters.config(kw["ctx"], fill(tpl, kw)))

    router.add_api_route(
        path + "/config",
        endpoint(config, signature(params_of(tpl))),
        methods=["POST"],
        response_model=m.ClusterConfig,
        response_model_exclude_none=True,
        operation_id=operation_id("GetClusterConfig", path, "post"),
        tags=["Cluster"],
        summary="ClusterConfig: the effective settings the cluster's control plane syncs",
    )


def add_routes(router: APIRouter) -> None:
    for tpl in item_templates("Cluster"):
        _add(router, tpl)
