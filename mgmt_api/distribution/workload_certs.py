"""``meshplane.workload.v1.WorkloadCertificates/Sign``: a workload certificate for a verified pod.

The pod-local sidecar agent sends a CSR with its pod's projected token as
``authorization: Bearer``. The servicer, on mgmt-api's gRPC port beside ADS:

1. verifies the token against the cluster the request names
   (:meth:`mgmt_api.service.workload_trust.Attestation.verify`): no token is
   UNAUTHENTICATED, a token that does not verify or names a pod the
   inventory does not have (any more) is PERMISSION_DENIED;
2. checks the CSR (:func:`mgmt_api.domain.workload_attest.check_csr`): one
   URI SAN, the SPIFFE id of the VERIFIED namespace and service account in
   the cluster's trust domain (another is PERMISSION_DENIED), a P-256 key
   this replica never signed before (else INVALID_ARGUMENT);
3. signs it with the cluster's mesh CA (the one that signs in the current
   phase of a CA rotation) for ``certificate_ttl``, records which CA signed
   the pod's certificate (:meth:`MeshCaStore.note_signed`, what a rotation
   waits on) and answers the certificate, the trust bundle and its notAfter.

mgmt-api never generates or sees a workload's private key. Every issue is
one log line (SPIFFE id, serial, notAfter) and every outcome a count
(:class:`~mgmt_api.distribution.metrics.AttestationCounts`); the connected
sidecar's certificate expiry goes to the directory's gauge.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from meshplane.gateway_contract import NodeError, parse_node
from meshplane.proto.workload.v1 import workload_pb2 as pb
from meshplane.proto.workload.v1 import workload_pb2_grpc as pb_grpc
from mgmt_api.distribution.metrics import AttestationCounts
from mgmt_api.distribution.streams import Context
from mgmt_api.domain import mesh_ca, workload_attest
from mgmt_api.domain.workload_attest import AttestationError, SeenKeys
from mgmt_api.service.enforcement import UnknownCluster
from mgmt_api.service.mesh_ca import MeshCaStore
from mgmt_api.service.sidecars import SidecarDirectory
from mgmt_api.service.workload_trust import Attestation

log = logging.getLogger(__name__)

#: What Sign answers for each refusal reason (the rest are PERMISSION_DENIED).
_CODES = {
    "no_token": grpc.StatusCode.UNAUTHENTICATED,
    "request": grpc.StatusCode.INVALID_ARGUMENT,
    "csr_invalid": grpc.StatusCode.INVALID_ARGUMENT,
    "key_reused": grpc.StatusCode.INVALID_ARGUMENT,
}


@dataclass
class WorkloadCertificatesServicer(pb_grpc.WorkloadCertificatesServicer):
    """See the module docstring."""

    attestation: Attestation
    cas: MeshCaStore
    counts: AttestationCounts
    directory: SidecarDirectory | None = None
    certificate_ttl: float = mesh_ca.DEFAULT_SVID_TTL
    clock: Callable[[], float] = time.time
    seen: SeenKeys = field(default_factory=SeenKeys)

    async def Sign(self, request: pb.SignRequest, context: Context) -> pb.SignResponse:
        try:
            return await asyncio.to_thread(self._sign, request, _bearer(context))
        except AttestationError as exc:
            self.counts.refused(exc.reason)
            log.warning(
                "refused a workload certificate",
                extra={"cluster": request.cluster[:256], "reason": exc.reason, "error": str(exc)},
            )
            await context.abort(_CODES.get(exc.reason, grpc.StatusCode.PERMISSION_DENIED), str(exc))
            raise  # pragma: no cover - abort raises
        except Exception:  # the store, the CA: said in the log, not to the caller
            self.counts.refused("internal")
            log.exception("cannot sign a workload certificate")
            await context.abort(grpc.StatusCode.UNAVAILABLE, "cannot sign now; retry")
            raise  # pragma: no cover - abort raises

    def _sign(self, request: pb.SignRequest, token: str) -> pb.SignResponse:
        if not token:
            raise AttestationError("no_token", "a bearer token is required")
        try:
            node = parse_node(request.instance or "-", request.cluster, {})
        except NodeError as exc:
            raise AttestationError("request", str(exc)) from None
        org, cluster = node.organization, node.cluster
        try:
            attested = self.attestation.verify(token, org, cluster)
            ca = self.cas.get(org, cluster)
            bundle = self.cas.trust_bundle(org, cluster)
        except UnknownCluster:
            raise AttestationError("cluster", f"no cluster {request.cluster}") from None
        identity = attested.spiffe_id(ca.trust_domain)
        key = workload_attest.check_csr(request.csr_pem, identity)
        digest = workload_attest.key_digest(key)
        if not self.seen.claim(digest):
            raise AttestationError("key_reused", "the CSR's key was signed before: use a new key")
        now = self.clock()
        certificate = mesh_ca.issue_svid(ca, identity, key, now, self.certificate_ttl)
        not_after = int(certificate.not_valid_after_utc.timestamp())
        # Before the answer: a CA rotation waits on which CA signed each pod's certificate.
        self.cas.note_signed(org, cluster, attested.grant, ca.certificate.serial_number, not_after)
        if self.directory is not None:
            self.directory.issued(org, cluster, attested.grant, not_after)
        self.counts.issued()
        log.info(
            "issued a workload certificate",
            extra={
                "cluster": node.node_cluster,
                "instance": request.instance[:256],
                "pod": f"{attested.claims.namespace}/{attested.claims.pod_name}",
                "spiffeId": identity,
                "serial": f"{certificate.serial_number:x}",
                "notAfter": not_after,
            },
        )
        return pb.SignResponse(
            certificate_chain_pem=mesh_ca.pem(certificate),
            trust_bundle_pem=list(bundle),
            not_after_unix=not_after,
        )


def _bearer(context: Context) -> str:
    metadata = dict(context.invocation_metadata() or ())
    scheme, _, token = str(metadata.get("authorization", "")).partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def add_to_server(servicer: WorkloadCertificatesServicer, server: grpc.aio.Server) -> None:
    pb_grpc.add_WorkloadCertificatesServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
