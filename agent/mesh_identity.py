"""The cluster agent's own mesh certificate: its only credential towards sidecars.

A sidecar's Envoy admin API is a Unix socket in its pod. The sidecar
exposes the allow-listed part of it on one pod port, behind mTLS that
accepts only a client certificate of the cluster's mesh CA whose URI SAN is
the cluster agent's SPIFFE id (``--diagnostics-caller`` of the sidecar
agent; docs/mesh.md, "Trust model"). The agent gets that certificate as
every sidecar gets its own: a fresh P-256 key in memory, a CSR for
``spiffe://TD/ns/NS/sa/SA`` of its pod's projected token, and
``WorkloadCertificates/Sign`` with that token (so mgmt-api attests the
agent's pod against the cluster's inventory, as any workload's).
:class:`sidecar_agent.certificates.CertificateKeeper` runs that loop
(renewal at half-life, backoff while mgmt-api is away); this module holds
the result as an :class:`ssl.SSLContext` for the admin client.

The key never touches a disk: :mod:`ssl` loads a chain only from a path, so
it is handed one in an anonymous memory file (``memfd_create``), closed
right after.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import time
from pathlib import Path

import grpc

from sidecar_agent import identity
from sidecar_agent.certificates import CertificateKeeper, KeeperMetrics, grpc_signer
from sidecar_agent.identity import Issued
from sidecar_agent.relay import read_token
from sidecar_agent.sds import SecretState

log = logging.getLogger(__name__)


class NoCertificate(Exception):
    """The agent holds no mesh certificate (yet, or not configured)."""


def client_context(issued: Issued, key_pem: str) -> ssl.SSLContext:
    """TLS towards sidecars: present ``issued`` with its key, trust only the mesh CAs.

    Sidecars are reached by address (discovery's), and their certificates
    name a SPIFFE id, not a host: the chain is checked against the trust
    bundle, the host name is not (the caller checks the peer's namespace).
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cadata="".join(issued.trust_bundle))
    fd = os.memfd_create("meshplane-agent-svid", os.MFD_CLOEXEC)
    try:
        os.write(fd, (issued.certificate_pem + key_pem).encode("ascii"))
        context.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)
    return context


class MeshIdentity:
    """Keeps the agent's certificate fresh and its TLS context current."""

    def __init__(
        self, channel: grpc.aio.Channel, node_cluster: str, instance: str, token_file: Path,
        trust_domain: str, *, metrics: KeeperMetrics | None = None,
    ) -> None:  # fmt: skip
        self._metrics = metrics or KeeperMetrics()
        self.token_file = token_file
        self.state = SecretState()
        self.keeper = CertificateKeeper(
            grpc_signer(channel, node_cluster, instance),
            token=self._token,
            trust_domain=trust_domain,
            state=self.state,
            clock=time.time,
            metrics=KeeperMetrics(issued=self._issued, failed=self._metrics.failed),
        )
        self._context: ssl.SSLContext | None = None
        self._serial: int | None = None
        self._task: asyncio.Task[None] | None = None

    def _token(self) -> str:
        return read_token(self.token_file, identity.MAX_TOKEN_BYTES)

    def _issued(self, issued: Issued) -> None:
        secret = self.state.secret
        assert secret is not None
        key_pem = secret.tls_certificate.private_key.inline_string
        self._context = client_context(issued, key_pem)
        self._serial = issued.serial
        self._metrics.issued(issued)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self.keeper.run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def context(self) -> tuple[int, ssl.SSLContext]:
        """(serial, context) of the current certificate; NoCertificate before the first."""
        if self._context is None or self._serial is None:
            raise NoCertificate("the agent holds no mesh certificate yet (Sign has not answered)")
        return self._serial, self._context
