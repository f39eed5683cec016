"""``POST .../clusters/{cluster}/config``: the settings a cluster's control plane syncs.

The values are the cluster's *effective* settings: its own spec under the
defaults and mandates of the profiles attached above it, exactly as
``.../clusters/{cluster}/blame`` shows them (:mod:`mgmt_api.service.profiles`),
so an organization's mandate (a ``network``, say) is what the cluster applies,
not just what blame reports.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection

from meshplane.kinds_contract import Kind
from mgmt_api import access
from mgmt_api import fqn as fqnmod
from mgmt_api.access import CallContext
from mgmt_api.domain import blame, mesh_ca, rbac
from mgmt_api.errors import not_found
from mgmt_api.kinds.cluster import DEFAULT_TOKEN_TTL
from mgmt_api.service.profiles import settings_layers
from mgmt_api.store import repo
from mgmt_api.store.uow import UnitOfWork

SYNCED = (
    "network",
    "trustDomain",
    "namespaceScope",
    "configGenerationMetadata",
    "rateLimit",
    "extAuthz",
    "circuitBreakers",
    "tracing",
)


def trust_domain(conn: Connection, res: repo.Resource) -> str:
    """The cluster's sidecars' SPIFFE trust domain: its effective ``trustDomain`` (own
    spec over profiles, as ClusterConfig shows it), else the default of its name."""
    settings = blame.effective(blame.blame(settings_layers(conn, res).layers))
    parsed = fqnmod.parse(res.fqn)
    return mesh_ca.trust_domain_of(parsed.name_in("organizations") or "", parsed.name, settings)


class ClusterService:
    def __init__(self, uow: UnitOfWork) -> None:
        self.uow = uow

    def config(self, ctx: CallContext, fqn: str) -> dict[str, Any]:
        parsed = fqnmod.parse(fqn)
        with self.uow.read() as conn:
            access.require(conn, ctx.principal, fqn, Kind.CLUSTER, rbac.READ)
            res = repo.get(conn, fqn)
            if res is None:
                raise not_found(fqn)
            org = repo.get(conn, parsed.parent)
            layers = settings_layers(conn, res).layers
            revision = repo.current_revision(conn)
        settings = blame.effective(blame.blame(layers))
        out: dict[str, Any] = {
            "cluster": fqn,
            "tier1Cluster": bool(settings.get("tier1Cluster")),
            "tokenTtl": settings.get("tokenTtl", DEFAULT_TOKEN_TTL),
            "systemNamespaces": (org.spec.get("systemNamespaces") if org else None) or [],
            "revision": revision,
        }
        out.update({key: settings[key] for key in SYNCED if key in settings})
        # The sidecars' trust domain, also when the cluster names none (docs/mesh.md).
        out["trustDomain"] = mesh_ca.trust_domain_of(
            parsed.name_in("organizations") or "", parsed.name, settings
        )
        return out
