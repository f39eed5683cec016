"""The mesh of a cluster (``/ui/o/{org}/c/{cluster}/workloads``).

One row per connected sidecar from ``GET .../workloads`` with the signed-in
user's token (READ on the cluster): service, SPIFFE identity, certificate
expiry, mode and who may call it, config state, replica, and a link to its
diagnostics. The trust domain and mesh namespaces head the page.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from fastapi import APIRouter, Depends, Response

from mgmt_api.console import mesh
from mgmt_api.console.tree_pages import Name
from mgmt_api.console.web import ConsoleRoute, User, signed_in

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)
Me = Annotated[User, Depends(signed_in)]


@router.get("/ui/o/{org}/c/{cluster}/workloads")
async def workloads_page(me: Me, org: Name, cluster: Name) -> Response:
    view = await me.api.get(f"/v2/organizations/{org}/clusters/{cluster}/workloads")
    return me.render(
        "workloads.html",
        org=org,
        cluster=cluster,
        view=view,
        rows=mesh.workload_rows(view, dt.datetime.now(dt.UTC)),
    )
