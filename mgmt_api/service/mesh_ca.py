"""Each cluster's mesh CA: created on first use, kept in the store, rotated on request.

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

Rotation (docs/mesh.md, "CA rotation"; the machine is
:mod:`mgmt_api.domain.ca_rotation`): its state and the new CA sit in a second
row beside the CA's (``…/rotation``), so every replica agrees on the phase
and a restart resumes it. :meth:`MeshCaStore.get` returns the CA that signs in
the current phase, carrying the other one as ``also_trusted``. Which CA signed
each instance's current certificate is recorded at issue time
(:meth:`MeshCaStore.note_signed`, one row per instance, bounded), and the
replicas that serve ADS advance every running rotation from those records
(:func:`advance_forever`). Each phase change is a store write that moves the
revision, so every sidecar stream of every replica recompiles with the new
bundle or signer; each is audited on the cluster.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NotRequired, TypedDict

from cryptography import x509
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from meshplane.kinds_contract import Kind
from mgmt_api import access
from mgmt_api import fqn as fqnmod
from mgmt_api.access import CallContext
from mgmt_api.domain import ca_rotation, mesh_ca, rbac
from mgmt_api.domain.ca_rotation import Event, Phase, Rotation, RotationRunning, SigningRecord
from mgmt_api.domain.mesh_ca import CertificateAuthority
from mgmt_api.domain.times import rfc3339
from mgmt_api.errors import ApiError, Code, not_found
from mgmt_api.service import clusters
from mgmt_api.service.enforcement import UnknownCluster
from mgmt_api.service.sidecars import MAX_SIDECARS_PER_CLUSTER
from mgmt_api.store import repo
from mgmt_api.store.uow import SYSTEM, UnitOfWork

log = logging.getLogger(__name__)

#: CAs kept in memory (~1.5 KiB each, certificate and key objects): 256 ≈ 400 KiB.
MAX_CACHED = 256
#: Signing records kept per cluster (~200 B each): one per instance holding an
#: unexpired certificate, as many as sidecars may connect to one replica.
MAX_RECORDS = MAX_SIDECARS_PER_CLUSTER
#: Longest instance name a record keeps (the key is its digest).
MAX_INSTANCE = 256
#: How often a replica serving ADS advances the running rotations (seconds).
TICK_SECONDS = 2.0
#: Running rotations one tick looks at (every cluster of a large install).
MAX_ROTATIONS = 10_000

ROTATE_OPERATION = "ROTATE_MESH_CA"


class CaSummary(TypedDict):
    fingerprint: str
    notAfter: str


class MeshCaView(TypedDict):
    """The ``meshCa`` section of ``GET .../clusters/{cluster}/status``."""

    phase: str
    phaseSince: NotRequired[str]
    startTime: NotRequired[str]
    signing: NotRequired[CaSummary]
    old: NotRequired[CaSummary]
    new: NotRequired[CaSummary]
    progress: dict[str, int]


def _time(seconds: float) -> str:
    return rfc3339(round(seconds * 1e6))


def _summary(certificate: x509.Certificate) -> CaSummary:
    return {
        "fingerprint": mesh_ca.fingerprint(certificate),
        "notAfter": _time(certificate.not_valid_after_utc.timestamp()),
    }


@dataclass(frozen=True)
class _Rows:
    """A cluster's CA rows as one transaction read them."""

    fqn: str
    key: str  # the CA's row; its rotation and records are derived from it
    trust_domain: str
    ca: str | None
    rotation: str | None


def _record(value: str) -> SigningRecord | None:
    try:
        doc = json.loads(value)
        return SigningRecord(
            str(doc["instance"]), str(doc["issuer"]), float(doc["notAfter"]), float(doc["issued"])
        )
    except (ValueError, KeyError, TypeError):
        return None


class MeshCaStore:
    """(organization, cluster) → its :class:`CertificateAuthority`; see the module docstring."""

    def __init__(
        self,
        uow: UnitOfWork,
        clock: Callable[[], float] = time.time,
        settle: float = ca_rotation.SETTLE,
    ) -> None:
        """``settle``: a rotation phase's wait after its last certificate
        (``MESHPLANE_MESH_CA_SETTLE``; :data:`ca_rotation.SETTLE` by default)."""
        self.uow = uow
        self.clock = clock
        self.settle = settle
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], CertificateAuthority] = OrderedDict()

    # -- reading ---------------------------------------------------------------

    def _rows(self, conn: Connection, organization: str, cluster: str) -> _Rows:
        cluster_fqn = fqnmod.cluster_fqn(organization, cluster)
        res = repo.get(conn, cluster_fqn)
        if res is None:
            raise UnknownCluster(cluster_fqn)
        trust_domain = clusters.trust_domain(conn, res)
        key = mesh_ca.store_key(cluster_fqn, res.create_time, trust_domain)
        rotation = repo.kv_get(conn, mesh_ca.rotation_key(key))
        return _Rows(cluster_fqn, key, trust_domain, repo.kv_get(conn, key), rotation)

    def _load(self, trust_domain: str, doc: dict[str, str]) -> CertificateAuthority:
        """A stored CA, parsed once per certificate (parsing the key is the cost)."""
        cache_key = (trust_domain, doc["cert"])
        with self._lock:
            ca = self._cache.get(cache_key)
            if ca is not None:
                self._cache.move_to_end(cache_key)
                return ca
        ca = CertificateAuthority.load(trust_domain, doc["cert"], doc["key"])
        with self._lock:
            self._cache[cache_key] = ca
            while len(self._cache) > MAX_CACHED:
                self._cache.popitem(last=False)
        return ca

    def _signing(self, rows: _Rows, stored: str) -> CertificateAuthority:
        """The CA that signs in the current phase, the other one as ``also_trusted``."""
        ca = self._load(rows.trust_domain, json.loads(stored))
        if rows.rotation is None:
            return ca
        doc = json.loads(rows.rotation)
        state = ca_rotation.from_json(doc)
        if state.phase not in ca_rotation.RUNNING:
            return ca
        new = self._load(rows.trust_domain, doc["new"])
        if state.phase is Phase.TRUSTING:
            return replace(ca, also_trusted=(new.certificate_pem,))
        return replace(new, also_trusted=(ca.certificate_pem,))

    def get(self, organization: str, cluster: str) -> CertificateAuthority:
        """The cluster's signing CA for its current trust domain; creates it on first use.

        During a rotation it carries the other CA in ``also_trusted``. Raises
        :class:`UnknownCluster` when the cluster does not exist (the stream
        that asked is then closed).
        """
        with self.uow.read() as conn:
            rows = self._rows(conn, organization, cluster)
        stored = rows.ca if rows.ca is not None else self._create(rows.key, rows.trust_domain)
        return self._signing(rows, stored)

    def trust_bundle(self, organization: str, cluster: str) -> tuple[str, ...]:
        """The CA certificates (PEM) a workload of the cluster trusts, the signing CA first.

        One CA outside a rotation, both during its overlap. The mesh-ca secret
        sidecars get and the Sign answer carry this bundle.
        """
        return self.get(organization, cluster).trust_bundle

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

    # -- signing records -----------------------------------------------------

    def note_signed(
        self, organization: str, cluster: str, instance: str, issuer_serial: int, not_after: float
    ) -> None:
        """Record that ``instance``'s current certificate was signed by the CA of
        ``issuer_serial`` and expires at ``not_after`` (Unix s): what a rotation
        waits on. Called where certificates are issued, before they are sent."""
        now = self.clock()
        with self.uow.read() as conn:
            rows = self._rows(conn, organization, cluster)
        value = json.dumps(
            {
                "instance": instance[:MAX_INSTANCE],
                "issuer": f"{issuer_serial:x}",  # as mesh_ca.serial writes it
                "notAfter": not_after,
                "issued": now,
            }
        )
        record_key = mesh_ca.record_key(rows.key, instance)
        with self.uow.write_rows() as conn:
            if repo.kv_get(conn, record_key) is None and not self._room(conn, rows.key, now):
                log.warning(
                    "too many signing records for the cluster; not recorded",
                    extra={"cluster": rows.fqn, "instance": instance[:MAX_INSTANCE]},
                )
                return
            repo.kv_put(conn, record_key, value)

    @staticmethod
    def _room(conn: Connection, ca_key: str, now: float) -> bool:
        """Whether a new instance's record fits, after dropping expired ones if full."""
        rows = repo.kv_scan(conn, mesh_ca.records_prefix(ca_key), limit=MAX_RECORDS + 1)
        if len(rows) < MAX_RECORDS:
            return True
        expired = [k for k, v in rows if (r := _record(v)) is None or r.not_after <= now]
        repo.kv_delete(conn, expired)
        return len(rows) - len(expired) < MAX_RECORDS

    @staticmethod
    def _records(conn: Connection, ca_key: str) -> list[SigningRecord]:
        found = repo.kv_scan(conn, mesh_ca.records_prefix(ca_key), limit=MAX_RECORDS)
        return [r for _, v in found if (r := _record(v)) is not None]

    # -- rotation --------------------------------------------------------------

    def rotate(self, ctx: CallContext, organization: str, cluster: str) -> MeshCaView:
        """Start a rotation (SET_POLICY on the cluster); 409 while one runs."""
        cluster_fqn = fqnmod.cluster_fqn(organization, cluster)
        with self.uow.read() as conn:
            access.require(conn, ctx.principal, cluster_fqn, Kind.CLUSTER, rbac.SET_POLICY)
            if not repo.exists(conn, cluster_fqn):
                raise not_found(cluster_fqn)
        return self.start(organization, cluster, ctx.principal.fqn)

    def start(self, organization: str, cluster: str, actor: str) -> MeshCaView:
        """Start a rotation as ``actor`` (who is allowed: :meth:`rotate`); 409 while one runs."""
        cluster_fqn = fqnmod.cluster_fqn(organization, cluster)
        current = self.get(organization, cluster)  # the CA being replaced exists first
        now = self.clock()
        new = mesh_ca.new_ca(current.trust_domain, now, mesh_ca.new_key())
        with self.uow.write(actor) as tx:
            rows = self._rows(tx.conn, organization, cluster)
            state = self._state(rows)
            try:
                started = ca_rotation.step(state, Event.START, now)
            except RotationRunning as exc:
                raise ApiError(
                    Code.ABORTED,
                    f"a rotation of {cluster_fqn}'s mesh CA is already {state.phase.value}",
                    metadata={"fqn": cluster_fqn, "phase": state.phase.value},
                ) from exc
            doc = {
                **ca_rotation.to_json(started),
                "cluster": cluster_fqn,
                "new": {"cert": new.certificate_pem, "key": new.key_pem()},
            }
            repo.kv_put(tx.conn, mesh_ca.rotation_key(rows.key), json.dumps(doc))
            tx.audit(
                cluster_fqn,
                Kind.CLUSTER,
                ROTATE_OPERATION,
                f"started a rotation of {cluster_fqn}'s mesh CA",
                newCa=mesh_ca.fingerprint(new.certificate),
            )
        return self.view(organization, cluster)

    @staticmethod
    def _state(rows: _Rows) -> Rotation:
        return (
            Rotation()
            if rows.rotation is None
            else ca_rotation.from_json(json.loads(rows.rotation))
        )

    def advance_all(self) -> int:
        """Tick every running rotation; how many changed phase."""
        with self.uow.read() as conn:
            found = repo.kv_scan(conn, "mesh-ca/", mesh_ca.ROTATION_SUFFIX, limit=MAX_ROTATIONS)
        moved = 0
        for key, value in found:
            try:
                if ca_rotation.from_json(json.loads(value)).phase in ca_rotation.RUNNING:
                    moved += self._advance(key.removesuffix(mesh_ca.ROTATION_SUFFIX), value)
            except Exception:  # one cluster's failure does not stop the others'
                log.exception("cannot advance a mesh CA rotation")
        return moved

    def _advance(self, ca_key: str, seen: str) -> int:
        """Tick one rotation whose row read ``seen``; 1 if its phase changed."""
        now = self.clock()
        doc = json.loads(seen)
        state = ca_rotation.from_json(doc)
        with self.uow.read() as conn:
            records = self._records(conn, ca_key)
        new_ca = mesh_ca.load_certificate(doc["new"]["cert"])
        progress = ca_rotation.progress_of(records, mesh_ca.serial(new_ca), state.since, now)
        after = ca_rotation.step(state, Event.TICK, now, progress, self.settle)
        if after == state:
            return 0
        cluster_fqn = str(doc.get("cluster", ""))
        rotation_key = mesh_ca.rotation_key(ca_key)
        with self.uow.write(SYSTEM) as tx:
            if repo.kv_get(tx.conn, rotation_key) != seen:
                return 0  # another replica moved it first (or the cluster went)
            if after.phase is Phase.DONE:
                old = repo.kv_get(tx.conn, ca_key)
                previous = (
                    _summary(mesh_ca.load_certificate(json.loads(old)["cert"])) if old else None
                )
                repo.kv_put(tx.conn, ca_key, json.dumps(doc["new"]))
                doc = {"cluster": cluster_fqn, "previous": previous}
            doc.update(ca_rotation.to_json(after))
            repo.kv_put(tx.conn, rotation_key, json.dumps(doc))
            tx.audit(
                cluster_fqn,
                Kind.CLUSTER,
                ROTATE_OPERATION,
                f"the rotation of {cluster_fqn}'s mesh CA is {after.phase.value}",
                phase=after.phase.value,
                sidecars=progress.sidecars,
            )
        log.info(
            "mesh CA rotation moved",
            extra={"cluster": cluster_fqn, "phase": after.phase.value},
        )
        return 1

    # -- the status --------------------------------------------------------------

    def certificates(self, organization: str, cluster: str) -> dict[str, SigningRecord]:
        """Instance (a sidecar's verified pod, ``NS/NAME/UID``) → its current
        certificate's signing record: the workloads view's expiry and issuer."""
        with self.uow.read() as conn:
            rows = self._rows(conn, organization, cluster)
            records = self._records(conn, rows.key)
        return {r.instance: r for r in records}

    def view(self, organization: str, cluster: str) -> MeshCaView:
        """The ``meshCa`` section of the cluster's status (no key material)."""
        with self.uow.read() as conn:
            rows = self._rows(conn, organization, cluster)
            records = self._records(conn, rows.key)
        if rows.ca is None:
            return {"phase": Phase.IDLE.value, "progress": {"sidecars": 0, "onNewCa": 0}}
        base = self._load(rows.trust_domain, json.loads(rows.ca))
        state = self._state(rows)
        doc = json.loads(rows.rotation) if rows.rotation else {}
        signing = self._signing(rows, rows.ca)
        out: MeshCaView = {"phase": state.phase.value, "progress": {}}
        if rows.rotation is not None:
            out["phaseSince"] = _time(state.since)
            out["startTime"] = _time(state.started)
        out["signing"] = _summary(signing.certificate)
        newest = base
        if state.phase in ca_rotation.RUNNING:
            newest = self._load(rows.trust_domain, doc["new"])
            out["old"], out["new"] = _summary(base.certificate), _summary(newest.certificate)
        elif doc.get("previous"):
            out["old"], out["new"] = doc["previous"], _summary(base.certificate)
        progress = ca_rotation.progress_of(
            records, mesh_ca.serial(newest.certificate), state.since, self.clock()
        )
        out["progress"] = {
            "sidecars": progress.sidecars,
            "onNewCa": progress.sidecars - progress.not_new,
        }
        return out


async def advance_forever(store: MeshCaStore, period: float = TICK_SECONDS) -> None:
    """Advance every running rotation every ``period`` seconds; cancel to stop.

    Every replica serving ADS runs this; a phase change is a compare-and-set
    on the rotation's row, so two replicas never both apply one."""
    while True:
        try:
            await asyncio.to_thread(store.advance_all)
        except Exception:
            log.exception("cannot advance the mesh CA rotations")
        await asyncio.sleep(period)
