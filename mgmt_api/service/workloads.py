"""``GET .../clusters/{cluster}/workloads``: the mesh of one cluster as people read it.

One row per registered sidecar (the registry every replica shares,
:mod:`mgmt_api.store.sidecars`): its service and SPIFFE identity, the
verified pod it runs for, which replica holds its stream, its certificate
(expiry and issuing CA, from the signing records the mesh CA keeps,
:meth:`~mgmt_api.service.mesh_ca.MeshCaStore.certificates`), its ADS state
(the same registry the cluster's status reads) and who may call it, read
off the rules its sidecar enforces (:func:`mgmt_api.compiler.mesh_authz.callers`
over the cluster's read model). Beside them, the cluster's trust domain
(:func:`mgmt_api.service.clusters.trust_domain`, the mesh CA's) and its mesh
namespaces: those the agent reports onboarded
(:func:`mgmt_api.domain.onboarding.reported_onboarded`) and those with a
connected sidecar, which proves injection there. Needs READ on the cluster;
nothing here is key material.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from meshplane.kinds_contract import Kind
from meshplane.sidecar_contract import SIDECAR_KIND
from mgmt_api import access
from mgmt_api import fqn as fqnmod
from mgmt_api.access import CallContext
from mgmt_api.compiler import mesh_authz
from mgmt_api.domain import onboarding, rbac
from mgmt_api.domain.times import rfc3339
from mgmt_api.errors import not_found
from mgmt_api.service.enforcement import EnforcementService, read_cluster
from mgmt_api.service.instances import InstanceStatus, SubscriberRegistry
from mgmt_api.service.mesh_ca import MeshCaStore
from mgmt_api.store import repo
from mgmt_api.store import sidecars as sidecar_store
from mgmt_api.store.uow import UnitOfWork

log = logging.getLogger(__name__)


def _time(seconds: float) -> str:
    return rfc3339(round(seconds * 1e6))


class WorkloadService:
    def __init__(
        self,
        uow: UnitOfWork,
        enforcement: EnforcementService,
        registry: SubscriberRegistry | None,
        mesh_ca: MeshCaStore,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.uow = uow
        self.enforcement = enforcement
        self.registry = registry  # None: no ADS on this server, so no config state
        self.mesh_ca = mesh_ca
        self.clock = clock

    def _desired(self, organization: str, cluster: str) -> str | None:
        if SIDECAR_KIND not in self.enforcement.kinds:
            return None
        try:
            return self.enforcement.desired_version(SIDECAR_KIND, organization, cluster)
        except Exception:  # the status says why; the workloads are still worth showing
            log.exception("cannot compile the sidecars' configuration")
            return ""

    def _config(
        self, states: dict[str, InstanceStatus], instance: str, desired: str | None, now: float
    ) -> dict[str, object] | None:
        status = states.get(instance)
        if status is None or self.registry is None:
            return None
        view = status.to_json(now, self.registry.stale_after)
        view["upToDate"] = desired is not None and status.applied_version == desired
        return view

    def list(self, ctx: CallContext, organization: str, cluster: str) -> dict[str, Any]:
        """The cluster's workloads view (see the module docstring)."""
        cluster_fqn = fqnmod.cluster_fqn(organization, cluster)
        with self.uow.read() as conn:
            access.require(conn, ctx.principal, cluster_fqn, Kind.CLUSTER, rbac.READ)
            policies = read_cluster(conn, organization, cluster)
            stored = repo.get(conn, cluster_fqn)
        if policies is None or stored is None:
            raise not_found(cluster_fqn)
        now = self.clock()
        rows = sidecar_store.registered(self.uow, organization, cluster)
        certificates = self.mesh_ca.certificates(organization, cluster)
        states: dict[str, InstanceStatus] = {}
        if self.registry is not None:
            states = {
                s.node.instance: s
                for s in self.registry.for_cluster(organization, cluster)
                if s.node.kind == SIDECAR_KIND
            }
        desired = self._desired(organization, cluster)
        td = policies.trust_domain
        workloads = []
        for row in rows:
            e = row.endpoint
            record = certificates.get(row.pod)
            workloads.append(
                {
                    "instance": row.instance,
                    "namespace": e.namespace,
                    "service": e.service,
                    "serviceAccount": e.service_account,
                    "spiffeId": mesh_authz.spiffe_id(td, e.namespace, e.service_account),
                    "pod": row.pod,
                    "inboundAddress": f"{e.host}:{e.port}",
                    "replica": row.replica,
                    "lastHeardTime": _time(row.heard),
                    "certificate": None
                    if record is None
                    else {
                        "notAfter": _time(record.not_after),
                        "issueTime": _time(record.issued),
                        "issuerSerial": record.issuer,
                        "expired": record.not_after <= now,
                    },
                    "authorization": mesh_authz.callers(
                        policies.mesh_settings, td, e.namespace
                    ).to_json(),
                    "config": self._config(states, row.instance, desired, now),
                }
            )
        return {
            "cluster": cluster_fqn,
            "trustDomain": td,
            "desiredVersion": desired,
            "namespaces": mesh_namespaces(stored.status, [row.endpoint.namespace for row in rows]),
            "workloads": workloads,
        }


def mesh_namespaces(
    status: Mapping[str, Any], sidecar_namespaces: Iterable[str]
) -> list[dict[str, Any]]:
    """The cluster's mesh namespaces: reported onboarded by the agent, or with a sidecar.

    ``status`` is the cluster's stored status (the agent's last report);
    each entry says which of the two made it one, and how many sidecars it has.
    """
    report = onboarding.report_of(status)
    reported = {name for name, on in (report.namespaces if report else {}).items() if on}
    counts: dict[str, int] = {}
    for namespace in sidecar_namespaces:
        counts[namespace] = counts.get(namespace, 0) + 1
    return [
        {"name": name, "reportedOnboarded": name in reported, "sidecars": counts.get(name, 0)}
        for name in sorted(reported | counts.keys())
    ]
