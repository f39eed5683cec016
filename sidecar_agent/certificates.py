"""Keeping the workload certificate fresh: sign at start, at half-life, and on a CA rotation.

:class:`CertificateKeeper` owns the loop: a fresh key, a CSR for the
token's identity, ``WorkloadCertificates/Sign`` with the token, the answer
into the SDS state. It signs again with a NEW key when half the
certificate's lifetime has passed, and at once when the relay reports a
trust bundle other than the one the current certificate came with (a CA
rotation's step: a new signing CA, or a CA added or dropped). While mgmt-api is
away, Envoy keeps the certificate it has (it is valid for the other half of
its life) and the keeper retries with a jittered backoff
(:class:`meshplane.backoff.Backoff`). The key exists only in this process
and in the SDS answer to Envoy. Without a trust domain given, it waits for
the first trust bundle the relay sees and takes the one its signing CA names
(:func:`~sidecar_agent.identity.trust_domain_of`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc

from meshplane.aio import wait_event
from meshplane.backoff import Backoff
from meshplane.proto.workload.v1 import workload_pb2, workload_pb2_grpc
from sidecar_agent import identity
from sidecar_agent.identity import Issued, TokenUnreadable
from sidecar_agent.sds import SecretState, svid_secret

log = logging.getLogger(__name__)

SIGN_TIMEOUT_SECONDS = 10.0
#: The shortest wait between two signed certificates (a certificate about to expire,
#: say of a CA at its end, must not make the agent ask Sign in a tight loop).
MIN_RENEW_SECONDS = 1.0

#: (CSR PEM, token) → the Sign answer; raises :class:`SignFailed`.
SignCall = Callable[[str, str], Awaitable[workload_pb2.SignResponse]]


class SignFailed(RuntimeError):
    """Sign did not give a certificate (the message is the status, never the token)."""


def grpc_signer(channel: grpc.aio.Channel, cluster: str, instance: str) -> SignCall:
    """Sign over ``channel`` (mgmt-api's gRPC port) as ``instance`` of ``cluster``."""
    stub = workload_pb2_grpc.WorkloadCertificatesStub(channel)  # type: ignore[no-untyped-call]

    async def sign(csr: str, token: str) -> workload_pb2.SignResponse:
        request = workload_pb2.SignRequest(csr_pem=csr, cluster=cluster, instance=instance)
        try:
            response: workload_pb2.SignResponse = await stub.Sign(
                request,
                metadata=(("authorization", f"Bearer {token}"),),
                timeout=SIGN_TIMEOUT_SECONDS,
            )
        except grpc.aio.AioRpcError as exc:
            raise SignFailed(f"{exc.code().name}: {(exc.details() or '')[:300]}") from None
        return response

    return sign


@dataclass
class KeeperMetrics:
    """Hooks for the metrics endpoint (no-ops by default)."""

    issued: Callable[[Issued], None] = lambda _issued: None
    failed: Callable[[], None] = lambda: None


class CertificateKeeper:
    """The workload's certificate, kept valid in :class:`SecretState`."""

    def __init__(
        self,
        sign: SignCall,
        *,
        token: Callable[[], str],
        trust_domain: str | None,
        state: SecretState,
        clock: Callable[[], float],
        metrics: KeeperMetrics | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        self.sign, self.token, self.trust_domain = sign, token, trust_domain
        self._learn = trust_domain is None  # from the trust bundle, and again on a change
        self.state, self.clock = state, clock
        self.metrics = metrics or KeeperMetrics()
        self.backoff = backoff or Backoff(maximum=30.0)
        self.issued: Issued | None = None
        self._wake = asyncio.Event()
        self._last_bundle: tuple[str, ...] = ()

    def trust_bundle_seen(self, bundle: tuple[str, ...]) -> None:
        """The relay saw the trust bundle (signing CA first): sign now if it is a new one
        the current certificate did not come with (each bundle once: no loop)."""
        if not bundle or bundle == self._last_bundle:
            return
        self._last_bundle = bundle
        learned = identity.trust_domain_of(bundle[0]) if self._learn else None
        if learned is not None and learned != self.trust_domain:
            log.info("the mesh's trust domain", extra={"trustDomain": learned})
            self.trust_domain = learned
            self._wake.set()
        elif self.issued is not None and self.issued.outdated_by(bundle):
            log.info("the mesh's trust bundle changed: signing a new certificate")
            self._wake.set()

    async def renew(self) -> Issued:
        """Sign a fresh key now and publish it; :class:`SignFailed` when that fails."""
        try:
            token = self.token()
            claims = identity.token_claims(token)
        except TokenUnreadable as exc:
            raise SignFailed(str(exc)) from None
        if self.trust_domain is None:
            raise SignFailed("the trust domain is not known yet")
        key = identity.new_key()
        csr = identity.csr_pem(key, identity.workload_id(self.trust_domain, claims))
        response = await self.sign(csr, token)
        try:
            issued = Issued.of(
                response.certificate_chain_pem, tuple(response.trust_bundle_pem), self.clock()
            )
        except ValueError:
            raise SignFailed("the management plane answered no certificate") from None
        await self.state.set(svid_secret(issued.certificate_pem, identity.key_pem(key)))
        self.issued = issued
        self.metrics.issued(issued)
        log.info(
            "signed a workload certificate",
            extra={"serial": format(issued.serial, "x"), "notAfter": issued.not_after},
        )
        return issued

    async def run(self) -> None:
        """Forever: renew when due (or on a CA change), retry with backoff on failure."""
        while True:
            self._wake.clear()
            if self.trust_domain is None:
                log.info("waiting for the trust bundle, which names the trust domain")
                await self._wake.wait()
                continue
            try:
                issued = await self.renew()
                self.backoff.reset()
                delay = max(MIN_RENEW_SECONDS, issued.renew_at - self.clock())
            except SignFailed as exc:
                self.metrics.failed()
                delay = self.backoff.next_wait()
                log.warning(
                    "cannot sign the workload certificate; keeping the current one",
                    extra={"reason": str(exc), "retryIn": round(delay, 2)},
                )
            await wait_event(self._wake, delay)
