"""``POST .../clusters/{cluster}/meshca:rotate``: start a rotation of the cluster's mesh CA.

Needs SET_POLICY on the cluster (the CA decides which workload certificates
every sidecar of the cluster accepts); a second start while one runs is 409
ABORTED. The answer is the ``meshCa`` section the cluster's status shows
(docs/mesh.md, "CA rotation").
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from meshplane.kinds_contract import Kind
from mgmt_api.routes.deps import Ctx, MeshCas, Name

router = APIRouter()


@router.post(
    "/v2/organizations/{organization}/clusters/{cluster}/meshca:rotate",
    tags=[Kind.CLUSTER],
    operation_id="RotateClusterMeshCa",
    summary="Start a rotation of the cluster's mesh CA (needs SET_POLICY on the cluster)",
)
def rotate_mesh_ca(ctx: Ctx, organization: Name, cluster: Name, cas: MeshCas) -> dict[str, Any]:
    return dict(cas.rotate(ctx, organization, cluster))
