"""The sidecar half of the ADS server (:mod:`mgmt_api.distribution.ads`).

Sidecars share the gateway's ADS protocol handling and differ in four ways,
all kept here:

- **admission** (:meth:`SidecarStreams.admit`): the stream's bearer is the
  pod's workload token (relayed by the pod-local sidecar agent), verified
  like ``WorkloadCertificates/Sign`` verifies it
  (:class:`~mgmt_api.service.workload_trust.Attestation`); the cluster
  agent's key and the gateway token are no workload's, so they never verify.
  The node metadata must announce the verified namespace and service account,
  a service the pod is in and the pod's address
  (:func:`~mgmt_api.domain.workload_attest.sidecar_refusal`): otherwise
  PERMISSION_DENIED, and the refusal is audited. Every wake re-checks that
  the pod is still in the inventory with the same uid (:meth:`SidecarStreams.still_admitted`):
  a deleted pod's stream closes, and it leaves the endpoints;
- their resources come from :func:`mgmt_api.compiler.sidecar_xds.compile_sidecar`;
- their input depends on which sidecars are connected (the endpoints), not
  only on the store, so their streams follow their OWN change feed, moved by
  the store's feed and by every join or leave of the
  :class:`~mgmt_api.service.sidecars.SidecarDirectory` (the store's revision
  numbers cannot be bumped locally: another replica's writes would then be
  missed);
- the only secret served is the cluster's trust bundle
  (:data:`~meshplane.workload_contract.CA_SECRET`). The workload certificate
  and its key never pass here: the pod-local agent holds the key, has it
  signed through Sign and serves it to Envoy over SDS in the pod.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable

from meshplane.distribution_contract import NodeIdentity
from meshplane.sidecar_contract import SidecarNode
from mgmt_api.compiler import sidecar_xds
from mgmt_api.compiler.gateway_xds import GatewayResources
from mgmt_api.distribution.feed import ChangeFeed, SharedBuilds
from mgmt_api.distribution.metrics import AttestationCounts
from mgmt_api.distribution.streams import StreamPlane
from mgmt_api.domain.workload_attest import AttestationError, sidecar_refusal
from mgmt_api.service.enforcement import UnknownCluster
from mgmt_api.service.instances import SubscriberRegistry
from mgmt_api.service.sidecars import SidecarDirectory
from mgmt_api.service.stream_auth import AuthError, Revocation
from mgmt_api.service.workload_trust import Attestation

log = logging.getLogger(__name__)

# (organization, cluster) → the cluster's sidecar input.
SidecarBuild = Callable[[tuple[str, str]], Awaitable[sidecar_xds.SidecarInput]]
# (organization, cluster) → the cluster's trust bundle (PEMs, the signing CA first).
BundleSource = Callable[[tuple[str, str]], Awaitable[tuple[str, ...]]]
#: The audit operation of a refused sidecar stream.
REFUSE_SIDECAR = "REFUSE_SIDECAR"


class SidecarStreams:
    """What every sidecar stream of one ADS server shares (see the module docstring)."""

    def __init__(
        self,
        build: SidecarBuild,
        bundle: BundleSource,
        directory: SidecarDirectory,
        store_feed: ChangeFeed,
        registry: SubscriberRegistry,
        *,
        attestation: Attestation,
        counts: AttestationCounts | None = None,
        clock: Callable[[], float] = time.time,
        heartbeat: float = 30.0,
    ) -> None:
        self.directory = directory
        self.attestation = attestation
        self.counts = counts or AttestationCounts()
        self.feed = ChangeFeed()
        self.plane = StreamPlane(self.feed, registry, self.still_admitted, clock, heartbeat)
        self._store_feed = store_feed
        self._builds: SharedBuilds[tuple[str, str], sidecar_xds.SidecarInput] = SharedBuilds(
            self.feed, build
        )
        # Shared like the input: one store read per cluster and change, not per
        # stream and heartbeat (a CA changes only with a write: a new trust
        # domain, a recreated cluster, a rotation).
        self._bundles: SharedBuilds[tuple[str, str], tuple[str, ...]] = SharedBuilds(
            self.feed, bundle
        )
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

    async def admit(self, token: str, node: SidecarNode) -> str:
        """The grant of a sidecar stream whose bearer is ``token``; :class:`AuthError` if not.

        The grant (the pod and its uid) is what :meth:`still_admitted` re-checks.
        """
        org, cluster = node.organization, node.cluster
        try:
            attested = await asyncio.to_thread(self.attestation.verify, token, org, cluster)
        except UnknownCluster:
            self.counts.admission("cluster")
            raise AuthError(f"no cluster {node.node_cluster}") from None
        except AttestationError as exc:
            self.counts.admission(exc.reason)
            log.warning(
                "refused a sidecar stream",
                extra={
                    "cluster": node.node_cluster,
                    "instance": node.instance[:256],
                    "error": str(exc),
                },
            )
            raise AuthError(str(exc)) from None
        refusal = sidecar_refusal(attested, node)
        if refusal is not None:
            self.counts.admission(refusal.reason)
            log.warning(
                "refused a sidecar stream",
                extra={
                    "cluster": node.node_cluster,
                    "instance": node.instance[:256],
                    "pod": f"{attested.pod.namespace}/{attested.pod.name}",
                    "error": str(refusal),
                },
            )
            try:
                await asyncio.to_thread(
                    self.attestation.audit_refusal,
                    org,
                    cluster,
                    attested,
                    refusal,
                    operation=REFUSE_SIDECAR,
                    instance=node.instance,
                )
            except Exception:  # the refusal stands even when the store cannot record it
                log.exception("cannot audit a refused sidecar stream")
            raise AuthError(str(refusal))
        self.counts.admission()
        return attested.grant

    async def still_admitted(self, grant: str, node: NodeIdentity) -> Revocation | None:
        """None while the stream's pod is in the inventory with its uid."""
        org, cluster = node.organization, node.cluster
        try:
            gone = await asyncio.to_thread(self.attestation.still_there, grant, org, cluster)
        except UnknownCluster:
            return Revocation("the cluster was deleted", cluster_gone=True)
        return None if gone is None else Revocation(gone)

    async def compile(
        self, node: SidecarNode, revision: int
    ) -> tuple[str, str, GatewayResources] | None:
        """(version, trust bundle digest, resources) of this sidecar at ``revision``;
        None when they cannot compile."""
        try:
            key = (node.organization, node.cluster)
            inp = await self._builds.get(key, revision)
            bundle = await self._bundles.get(key, revision)
            digest = hashlib.sha256("".join(bundle).encode()).hexdigest()[:16]
            sds = sidecar_xds.secrets(bundle)
            return inp.version(), digest, sidecar_xds.compile_sidecar(inp, node, sds)
        except UnknownCluster:
            raise
        except Exception:
            log.exception(
                "cannot compile the sidecar's configuration",
                extra={"cluster": node.cluster, "instance": node.instance},
            )
            return None
