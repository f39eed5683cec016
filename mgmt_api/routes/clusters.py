"""``POST .../clusters/{cluster}/config``: what a cluster's control plane syncs.

The response is the cluster's effective settings (profiles' defaults and
mandates applied), see :mod:`mgmt_api.service.clusters`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from meshplane.kinds_contract import Kind
from mgmt_api.kinds import item_templates
from mgmt_api.routes import templated as t
from mgmt_api.routes.deps import services
from mgmt_api.schemas import resources as m


def _add(router: APIRouter, tpl: str) -> None:
    def config(**kw: Any) -> Response:
        return t.json_response(services(kw["request"]).clusters.config(kw["ctx"], t.fill(tpl, kw)))

    t.Mount(router, "/v2/" + tpl, Kind.CLUSTER).add(
        "/config",
        "POST",
        config,
        t.signature(t.params_of(tpl)),
        name="GetClusterConfig",
        model=m.ClusterConfig,
        summary="ClusterConfig: the effective settings the cluster's control plane syncs",
    )


def add_routes(router: APIRouter) -> None:
    for tpl in item_templates(Kind.CLUSTER):
        _add(router, tpl)
