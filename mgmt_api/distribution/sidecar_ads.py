"""The sidecar half of the ADS server (:mod:`mgmt_api.distribution.ads`).

Sidecars share the gateway's ADS protocol handling and differ in three ways,
all kept here:

- their resources come from :func:`mgmt_api.compiler.sidecar_xds.compile_sidecar`;
- their input depends on which sidecars are connected (the endpoints), not
  only on the store, so their streams follow their OWN change feed, moved by
  the store's feed and by every join or leave of the
  :class:`~mgmt_api.service.sidecars.SidecarDirectory` (the store's revision
  numbers cannot be bumped locally: another replica's writes would then be
  missed);
- a sidecar joins the directory while its stream is open;
- each sidecar stream holds a workload certificate (:class:`WorkloadIdentity`):
  its key is generated here, in mgmt-api's memory, for this stream only, and
  never stored or logged (docs/mesh.md says why not in the pod). It is issued
  on the first build and re-issued, with a new key, on the first build past
  its half-life: the stream wakes every ``heartbeat`` seconds, so rotation is
  at most that late, and it goes out as an SDS push on the open stream. When
  the stream ends (the sidecar left, its key or cluster was revoked), so does
  issuance for it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from cryptography import x509

from meshplane.sidecar_contract import SidecarNode, spiffe_id
from mgmt_api.compiler import sidecar_xds
from mgmt_api.compiler.gateway_xds import GatewayResources
from mgmt_api.compiler.protojson import JsonDict
from mgmt_api.distribution.feed import ChangeFeed, SharedBuilds
from mgmt_api.distribution.streams import StillAdmitted, StreamPlane
from mgmt_api.domain import mesh_ca
from mgmt_api.domain.mesh_ca import CertificateAuthority
from mgmt_api.service.enforcement import UnknownCluster
from mgmt_api.service.instances import SubscriberRegistry
from mgmt_api.service.sidecars import SidecarDirectory

log = logging.getLogger(__name__)

# (organization, cluster) → the cluster's sidecar input.
SidecarBuild = Callable[[tuple[str, str]], Awaitable[sidecar_xds.SidecarInput]]
# (organization, cluster) → the cluster's mesh CA (created on first use).
CaSource = Callable[[tuple[str, str]], Awaitable[CertificateAuthority]]
# (node, issuer serial, notAfter) → recorded, before the certificate is sent
# (MeshCaStore.note_signed: what a mesh CA rotation waits on).
NoteSigned = Callable[[SidecarNode, int, float], Awaitable[None]]


async def _not_noted(node: SidecarNode, issuer_serial: int, not_after: float) -> None:
    return None


class WorkloadIdentity:
    """One sidecar stream's workload certificate (see the module docstring)."""

    def __init__(
        self, node: SidecarNode, ttl: float, issued: Callable[[float], None] = lambda _: None
    ) -> None:
        """``issued(not_after)`` hears of every new certificate (the expiry gauge)."""
        self.node = node
        self.ttl = ttl
        self._issued = issued
        self._trusted: tuple[str, ...] = ()  # the trust bundle sent with the certificate
        self._certificate: x509.Certificate | None = None
        self._secrets: tuple[JsonDict, ...] = ()

    @property
    def certificate(self) -> x509.Certificate | None:
        return self._certificate

    @property
    def serial(self) -> str:
        """The current certificate's serial in hex ("" before the first)."""
        return "" if self._certificate is None else f"{self._certificate.serial_number:x}"

    def secrets(self, ca: CertificateAuthority, now: float) -> tuple[JsonDict, ...]:
        """The SDS secrets to serve at ``now``: a new certificate when none, the
        trust bundle (the signing CA first) changed, or the current one is past
        its half-life."""
        current = self._certificate
        if (
            current is None
            or self._trusted != ca.trust_bundle
            or mesh_ca.rotation_due(current, now)
        ):
            self._issue(ca, now)
        return self._secrets

    def _issue(self, ca: CertificateAuthority, now: float) -> None:
        node = self.node
        key = mesh_ca.new_key()
        identity = spiffe_id(ca.trust_domain, node.namespace, node.service_account)
        certificate = mesh_ca.issue_svid(ca, identity, key.public_key(), now, self.ttl)
        self._secrets = sidecar_xds.secrets(
            mesh_ca.pem(certificate), mesh_ca.key_pem(key), ca.trust_bundle
        )
        self._certificate, self._trusted = certificate, ca.trust_bundle
        not_after = certificate.not_valid_after_utc.timestamp()
        self._issued(not_after)
        log.info(
            "issued a workload certificate",
            extra={
                "cluster": node.cluster,
                "instance": node.instance,
                "spiffeId": identity,
                "serial": self.serial,
                "notAfter": int(not_after),
            },
        )


class SidecarStreams:
    """What every sidecar stream of one ADS server shares (see the module docstring)."""

    def __init__(
        self,
        build: SidecarBuild,
        ca: CaSource,
        directory: SidecarDirectory,
        store_feed: ChangeFeed,
        registry: SubscriberRegistry,
        *,
        still_admitted: StillAdmitted | None = None,
        clock: Callable[[], float] = time.time,
        heartbeat: float = 30.0,
        certificate_ttl: float = mesh_ca.DEFAULT_SVID_TTL,
        note_signed: NoteSigned = _not_noted,
    ) -> None:
        """``certificate_ttl``: the workload certificates' lifetime (seconds)."""
        self.note_signed = note_signed
        self.directory = directory
        self.certificate_ttl = certificate_ttl
        self.feed = ChangeFeed()
        self.plane = StreamPlane(self.feed, registry, still_admitted, clock, heartbeat)
        self._store_feed = store_feed
        self._builds: SharedBuilds[tuple[str, str], sidecar_xds.SidecarInput] = SharedBuilds(
            self.feed, build
        )
        # Shared like the input: one store read per cluster and change, not per
        # stream and heartbeat (a CA changes only with a write: a new trust
        # domain, a recreated cluster).
        self._cas: SharedBuilds[tuple[str, str], CertificateAuthority] = SharedBuilds(self.feed, ca)
        directory.listeners.append(self._moved)

    def _moved(self) -> None:
        self.feed.notify()

    async def follow_store(self) -> None:
        """Move the sidecar feed whenever the store's moves; cancel to stop."""
        seen = self._store_feed.revision
        while True:
            seen = await self._store_feed.wait_beyond(seen)
            self.feed.notify()

    def start(self) -> asyncio.Task[None]:
        return asyncio.create_task(self.follow_store())

    def identity(self, node: SidecarNode, handle: int) -> WorkloadIdentity:
        """A new stream's certificate holder; its expiries go to the directory's gauge."""
        return WorkloadIdentity(
            node,
            self.certificate_ttl,
            lambda not_after: self.directory.certified(handle, not_after),
        )

    async def compile(
        self, node: SidecarNode, identity: WorkloadIdentity, revision: int
    ) -> tuple[str, str, GatewayResources] | None:
        """(version, certificate serial, resources) of this sidecar at ``revision``;
        None when they cannot compile."""
        try:
            key = (node.organization, node.cluster)
            inp = await self._builds.get(key, revision)
            ca = await self._cas.get(key, revision)
            serial = identity.serial
            sds = identity.secrets(ca, self.plane.clock())
            if identity.serial != serial and identity.certificate is not None:
                not_after = identity.certificate.not_valid_after_utc.timestamp()
                await self.note_signed(node, ca.certificate.serial_number, not_after)
            return inp.version(), identity.serial, sidecar_xds.compile_sidecar(inp, node, sds)
        except UnknownCluster:
            raise
        except Exception:
            log.exception(
                "cannot compile the sidecar's configuration",
                extra={"cluster": node.cluster, "instance": node.instance},
            )
            return None
