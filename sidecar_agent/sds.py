"""SDS for the pod's Envoy: the workload certificate and key, over a Unix socket.

State of the world, one secret (:data:`~meshplane.workload_contract.SVID_SECRET`):
:class:`SecretState` holds the current secret and a version that grows with
every new certificate; :func:`answer` is the pure decision of what a stream
sends next; :class:`SdsServicer` is the thin gRPC adapter that waits for
either a request from Envoy or a new version. The socket lives in the pod's
emptyDir, so only the containers that mount it (Envoy and this agent) can
ask; nothing else in the pod or on the network can.

A NACK (``error_detail``) is logged with Envoy's reason and the version is
not re-sent: the next certificate is the next chance.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.secret.v3 import sds_pb2_grpc

from meshplane.workload_contract import SVID_SECRET

log = logging.getLogger(__name__)

SECRET_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"  # noqa: S105
#: Requests larger than this end the stream (Envoy's are a few hundred bytes).
MAX_REQUEST_BYTES = 64 * 1024


def svid_secret(certificate_pem: str, key_pem: str) -> secret_pb2.Secret:
    """The SDS secret of the workload certificate (chain and key, inline)."""
    secret = secret_pb2.Secret(name=SVID_SECRET)
    secret.tls_certificate.certificate_chain.CopyFrom(
        base_pb2.DataSource(inline_string=certificate_pem)
    )
    secret.tls_certificate.private_key.CopyFrom(base_pb2.DataSource(inline_string=key_pem))
    return secret


@dataclass
class SecretState:
    """The current workload secret and its version (0: none yet)."""

    version: int = 0
    secret: secret_pb2.Secret | None = None
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def set(self, secret: secret_pb2.Secret) -> None:
        async with self._changed:
            self.secret, self.version = secret, self.version + 1
            self._changed.notify_all()

    async def wait_past(self, version: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.version > version)


def answer(
    state_version: int,
    secret: secret_pb2.Secret | None,
    requested: frozenset[str],
    sent_version: int,
    nonce: int,
) -> discovery_pb2.DiscoveryResponse | None:
    """The response a stream sends now, or None (nothing new, or nothing asked)."""
    if secret is None or state_version <= sent_version or SVID_SECRET not in requested:
        return None
    response = discovery_pb2.DiscoveryResponse(
        version_info=str(state_version), type_url=SECRET_TYPE, nonce=str(nonce)
    )
    response.resources.add().Pack(secret)
    return response


def requested_names(request: discovery_pb2.DiscoveryRequest) -> frozenset[str]:
    """What a SotW request subscribes to; a NACK is logged (Envoy's reason, no secret)."""
    if request.HasField("error_detail"):
        log.warning(
            "envoy refused the workload certificate",
            extra={"version": request.version_info, "reason": request.error_detail.message[:500]},
        )
    return frozenset(request.resource_names)


class SdsServicer(sds_pb2_grpc.SecretDiscoveryServiceServicer):  # type: ignore[misc]
    """``StreamSecrets`` (SotW) from :class:`SecretState`."""

    def __init__(self, state: SecretState) -> None:
        self.state = state

    async def StreamSecrets(
        self,
        request_iterator: AsyncIterator[discovery_pb2.DiscoveryRequest],
        context: grpc.aio.ServicerContext[
            discovery_pb2.DiscoveryRequest, discovery_pb2.DiscoveryResponse
        ],
    ) -> AsyncIterator[discovery_pb2.DiscoveryResponse]:
        requests: asyncio.Queue[discovery_pb2.DiscoveryRequest | None] = asyncio.Queue()

        async def read() -> None:
            async for request in request_iterator:
                await requests.put(request)
            await requests.put(None)

        reader = asyncio.ensure_future(read())
        requested: frozenset[str] = frozenset()
        sent = nonce = 0
        try:
            while True:
                response = answer(self.state.version, self.state.secret, requested, sent, nonce + 1)
                if response is not None:
                    nonce, sent = nonce + 1, self.state.version
                    yield response
                next_request = asyncio.ensure_future(requests.get())
                changed = asyncio.ensure_future(self.state.wait_past(sent))
                done, _ = await asyncio.wait(
                    {next_request, changed}, return_when=asyncio.FIRST_COMPLETED
                )
                changed.cancel()
                if next_request not in done:
                    next_request.cancel()
                    continue
                request = next_request.result()
                if request is None:
                    return
                requested = requested_names(request)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.RpcError):
                await reader
