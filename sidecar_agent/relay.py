"""The ADS relay: Envoy's stream on a Unix socket, to mgmt-api with the pod's token.

Envoy cannot present a token that the kubelet rotates under it, and its
bootstrap must hold none; so Envoy talks ADS to this agent over the pod-local
socket and the agent opens the stream to mgmt-api with
``authorization: Bearer <token>``, the token file read again on every
(re)connect (a rotated token is used from the next stream on). Requests go
up and responses come back unchanged; when mgmt-api ends the stream (a
refusal, a restart), the relay ends Envoy's with the same status and Envoy
reconnects by itself, through the relay, with its usual backoff. While
mgmt-api cannot be reached, the new stream waits for it (the channel's
``wait_for_ready``) instead of failing at once: Envoy's backoff, which grows
with every failed attempt (up to 30 s), does not grow during an outage, and
the stream resumes as soon as the channel reconnects.

One thing the relay looks at: a Secret response that carries the trust
bundle (:data:`~meshplane.workload_contract.CA_SECRET`), whose first
certificate is the signing CA. :func:`trust_bundle_of` extracts it and the
agent signs again at once when the bundle is not the one its certificate
came with (how each step of a CA rotation reaches every pod within seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

from meshplane.workload_contract import CA_SECRET
from sidecar_agent.identity import TokenUnreadable, certificates_in
from sidecar_agent.sds import SECRET_TYPE

log = logging.getLogger(__name__)

#: Largest message either way (mgmt-api's sidecar snapshots are well below).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


def trust_bundle_of(response: discovery_pb2.DiscoveryResponse) -> tuple[str, ...] | None:
    """The certificates of :data:`CA_SECRET` (the signing CA first) in a Secret response."""
    if response.type_url != SECRET_TYPE:
        return None
    for resource in response.resources:
        secret = secret_pb2.Secret()
        if not resource.Unpack(secret) or secret.name != CA_SECRET:
            continue
        trusted = secret.validation_context.trusted_ca
        pem = trusted.inline_string or trusted.inline_bytes.decode(errors="replace")
        return certificates_in(pem)
    return None


def read_token(path: Path, limit: int) -> str:
    """The token file's content, stripped; :class:`TokenUnreadable` says why not (not what)."""
    try:
        with path.open("rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise TokenUnreadable(f"cannot read the token file {path}: {exc.strerror}") from None
    if len(data) > limit:
        raise TokenUnreadable(f"the token file {path} is larger than {limit} bytes")
    token = data.decode(errors="replace").strip()
    if not token:
        raise TokenUnreadable(f"the token file {path} is empty")
    return token


class AdsRelay(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):  # type: ignore[misc]
    """``StreamAggregatedResources`` relayed to mgmt-api over ``channel``."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        token: Callable[[], str],
        on_trust_bundle: Callable[[tuple[str, ...]], None],
    ) -> None:
        self.stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
        self.token = token
        self.on_trust_bundle = on_trust_bundle

    async def StreamAggregatedResources(
        self,
        request_iterator: AsyncIterator[discovery_pb2.DiscoveryRequest],
        context: grpc.aio.ServicerContext[
            discovery_pb2.DiscoveryRequest, discovery_pb2.DiscoveryResponse
        ],
    ) -> AsyncIterator[discovery_pb2.DiscoveryResponse]:
        try:
            token = self.token()
        except TokenUnreadable as exc:
            log.warning("no workload token for the ADS stream", extra={"reason": str(exc)})
            context.set_code(grpc.StatusCode.UNAVAILABLE)
            context.set_details("the sidecar agent has no workload token")
            return
        upstream = self.stub.StreamAggregatedResources(
            metadata=(("authorization", f"Bearer {token}"),), wait_for_ready=True
        )

        async def pump() -> None:
            async for request in request_iterator:
                await upstream.write(request)
            await upstream.done_writing()

        pumping = asyncio.ensure_future(pump())
        try:
            async for response in upstream:
                bundle = trust_bundle_of(response)
                if bundle:
                    self.on_trust_bundle(bundle)
                yield response
        except grpc.aio.AioRpcError as exc:
            log.info(
                "the management plane ended the ADS stream",
                extra={"code": exc.code().name, "details": (exc.details() or "")[:300]},
            )
            context.set_code(exc.code())
            context.set_details(exc.details() or "")
        finally:
            upstream.cancel()
            pumping.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.RpcError):
                await pumping
