"""The read model workload attestation uses: each cluster's issuers and pods, cached.

:func:`mgmt_api.domain.workload_attest.trust_of` of the cluster row (its
agent's last report, its admin-registered issuers), kept per cluster so a
Sign call or a sidecar stream's wake costs no store read while nothing
changed. An entry is dropped:

- when this replica stores the cluster's next inventory report
  (:meth:`WorkloadTrustStore.reported`, called by the inventory service);
- when this replica commits any write (a changed ``workloadIdentity``, a
  deleted cluster): the unit of work's commit listeners;
- after :data:`MAX_AGE_SECONDS` in any case, which is how a report or a
  write stored by another replica reaches this one.

So a deleted pod stops verifying at most ``MAX_AGE_SECONDS`` after the
report that no longer lists it reached any replica (docs/mesh.md,
"Revocation").
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from meshplane.kinds_contract import Kind
from mgmt_api import fqn as fqnmod
from mgmt_api.domain import workload_attest
from mgmt_api.domain.workload_attest import Attested, ClusterTrust, trust_of
from mgmt_api.service.enforcement import UnknownCluster
from mgmt_api.store import repo
from mgmt_api.store.uow import UnitOfWork

#: How long an entry serves without a store read (bounds another replica's lag).
MAX_AGE_SECONDS = 5.0
#: Clusters kept, and pods kept across them (a pod is ~1 KiB in memory with its
#: strings and index entry: ~100 MiB at most). A cluster with more pods than
#: that is read from the store each time instead.
MAX_CACHED = 64
MAX_CACHED_PODS = 100_000


class WorkloadTrustStore:
    """(organization, cluster) → its :class:`ClusterTrust`; see the module docstring."""

    def __init__(self, uow: UnitOfWork, clock: Callable[[], float] = time.monotonic) -> None:
        self._uow = uow
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, tuple[float, ClusterTrust]] = OrderedDict()
        uow.listeners.subscribe(self._committed)

    def _committed(self, _revision: int) -> None:
        with self._lock:
            self._cache.clear()

    def reported(self, cluster_fqn: str) -> None:
        """The cluster's agent reported: its next read goes to the store."""
        with self._lock:
            self._cache.pop(cluster_fqn, None)

    def get(self, organization: str, cluster: str) -> ClusterTrust:
        """The cluster's trust; :class:`UnknownCluster` when there is no such cluster."""
        cluster_fqn = fqnmod.cluster_fqn(organization, cluster)
        now = self._clock()
        with self._lock:
            cached = self._cache.get(cluster_fqn)
            if cached is not None and now - cached[0] < MAX_AGE_SECONDS:
                self._cache.move_to_end(cluster_fqn)
                return cached[1]
        with self._uow.read() as conn:
            res = repo.get(conn, cluster_fqn)
        if res is None or res.kind != Kind.CLUSTER:
            raise UnknownCluster(cluster_fqn)
        trust = trust_of(res.status, res.spec)
        if len(trust.pods) <= MAX_CACHED_PODS:
            self._keep(cluster_fqn, now, trust)
        return trust

    def _keep(self, cluster_fqn: str, now: float, trust: ClusterTrust) -> None:
        with self._lock:
            self._cache[cluster_fqn] = (now, trust)
            self._cache.move_to_end(cluster_fqn)
            pods = sum(len(t.pods) for _, t in self._cache.values())
            while len(self._cache) > MAX_CACHED or pods > MAX_CACHED_PODS:
                _, (_, dropped) = self._cache.popitem(last=False)
                pods -= len(dropped.pods)


#: A refusal of the same pod for the same reason is audited once per this window
#: (a refused sidecar reconnects with backoff: one row, not one per attempt).
AUDIT_EVERY_SECONDS = 60.0
#: Remembered (pod, reason) pairs of that throttle.
MAX_AUDIT_KEYS = 10_000


class Attestation:
    """Verifies workload tokens for a cluster and audits the refusals of verified pods."""

    def __init__(
        self,
        uow: UnitOfWork,
        trust: WorkloadTrustStore,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.uow = uow
        self.trust = trust
        self.clock = clock
        self._lock = threading.Lock()
        self._audited: OrderedDict[tuple[str, str, str], float] = OrderedDict()

    def verify(self, token: str, organization: str, cluster: str) -> Attested:
        """The workload ``token`` names in the cluster (:func:`workload_attest.verify`)."""
        trust = self.trust.get(organization, cluster)
        return workload_attest.verify(token, trust, self.clock())

    def still_there(self, grant: str, organization: str, cluster: str) -> str | None:
        """None while the pod of ``grant`` is in the cluster's inventory, else why not."""
        return workload_attest.still_there(self.trust.get(organization, cluster), grant)

    def _due(self, key: tuple[str, str, str], now: float) -> bool:
        with self._lock:
            last = self._audited.get(key)
            if last is not None and now - last < AUDIT_EVERY_SECONDS:
                return False
            self._audited[key] = now
            self._audited.move_to_end(key)
            while len(self._audited) > MAX_AUDIT_KEYS:
                self._audited.popitem(last=False)
            return True

    def audit_refusal(
        self,
        organization: str,
        cluster: str,
        attested: Attested,
        error: workload_attest.AttestationError,
        *,
        operation: str,
        instance: str,
    ) -> None:
        """An audit record (operation ``operation``) of a verified pod refused ``error``."""
        cluster_fqn = fqnmod.cluster_fqn(organization, cluster)
        claims = attested.claims
        if not self._due((cluster_fqn, attested.grant, error.reason), self.clock()):
            return
        actor = f"system:serviceaccount:{claims.namespace}:{claims.service_account}"
        with self.uow.write(actor, bump=False) as tx:
            tx.audit(
                cluster_fqn,
                Kind.CLUSTER,
                operation,
                f"refused pod {claims.namespace}/{claims.pod_name} of {cluster_fqn}: {error}",
                reason=error.reason,
                pod=f"{claims.namespace}/{claims.pod_name}",
                podUid=claims.pod_uid,
                instance=instance[:256],
            )
