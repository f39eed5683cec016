"""Each cluster's mesh CA: created on first use, kept in the store, cached in memory.

Decision (docs/mesh.md, "The mesh CA"): the CA's private key lives in the
store's ``server_kv`` table (beside the session signing secret), under a key
derived from the cluster's FQN, its creation time and its trust domain, so a
recreated cluster or a changed trust domain gets a new CA and never trusts
the certificates of the old one. Every mgmt-api replica reads the same CA.
No API returns ``server_kv`` rows; the key is never logged; deleting the
cluster deletes its CAs (:class:`~mgmt_api.kinds.cluster.ClusterBehaviour`).
Who can read it: mgmt-api's processes and whoever can read the database.

Two replicas creating a cluster's first CA at once: the insert of one fails
on the primary key, and it reads the winner's.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from sqlalchemy.exc import IntegrityError

from mgmt_api import fqn as fqnmod
from mgmt_api.domain import mesh_ca
from mgmt_api.domain.mesh_ca import CertificateAuthority
from mgmt_api.service import clusters
from mgmt_api.service.enforcement import UnknownCluster
from mgmt_api.store import repo
from mgmt_api.store.uow import UnitOfWork

#: CAs kept in memory (~1.5 KiB each, certificate and key objects): 256 clusters ≈ 400 KiB.
MAX_CACHED = 256


class MeshCaStore:
    """(organization, cluster) → its :class:`CertificateAuthority`; see the module docstring."""

    def __init__(self, uow: UnitOfWork, clock: Callable[[], float] = time.time) -> None:
        self.uow = uow
        self.clock = clock
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, CertificateAuthority] = OrderedDict()

    def _cached(self, key: str) -> CertificateAuthority | None:
        with self._lock:
            ca = self._cache.get(key)
            if ca is not None:
                self._cache.move_to_end(key)
            return ca

    def _keep(self, key: str, ca: CertificateAuthority) -> CertificateAuthority:
        with self._lock:
            self._cache[key] = ca
            while len(self._cache) > MAX_CACHED:
                self._cache.popitem(last=False)
        return ca

    def get(self, organization: str, cluster: str) -> CertificateAuthority:
        """The cluster's CA for its current trust domain; creates it on first use.

        Raises :class:`UnknownCluster` when the cluster does not exist (the
        stream that asked is then closed).
        """
        cluster_fqn = fqnmod.cluster_fqn(organization, cluster)
        with self.uow.read() as conn:
            res = repo.get(conn, cluster_fqn)
            if res is None:
                raise UnknownCluster(cluster_fqn)
            trust_domain = clusters.trust_domain(conn, res)
            key = mesh_ca.store_key(cluster_fqn, res.create_time, trust_domain)
            cached = self._cached(key)
            if cached is not None:
                return cached
            stored = repo.kv_get(conn, key)
        if stored is None:
            stored = self._create(key, trust_domain)
        doc = json.loads(stored)
        return self._keep(key, CertificateAuthority.load(trust_domain, doc["cert"], doc["key"]))

    def trust_bundle(self, organization: str, cluster: str) -> tuple[str, ...]:
        """The CA certificates (PEM) a workload of the cluster trusts, the signing CA first.

        One CA per cluster and trust domain: its own certificate. The mesh-ca
        secret sidecars get and the Sign answer carry this bundle.
        """
        return (self.get(organization, cluster).certificate_pem,)

    def _create(self, key: str, trust_domain: str) -> str:
        ca = mesh_ca.new_ca(trust_domain, self.clock(), mesh_ca.new_key())
        value = json.dumps({"cert": ca.certificate_pem, "key": ca.key_pem()})
        try:
            with self.uow.write_rows() as conn:
                repo.kv_insert_new(conn, key, value)
        except IntegrityError:  # another replica (or stream) created it first
            with self.uow.read() as conn:
                won = repo.kv_get(conn, key)
            assert won is not None
            return won
        return value
