"""The ``AgentTunnel`` servicer: admits an agent's stream and serves it.

Admission is the policy stream's (:mod:`mgmt_api.distribution.server`): a
bearer JWT signed with a key of the cluster's agent service account, for the
tunnel's own audience, and the hello's cluster must be the key's cluster, so
a cluster's key can only ever serve that cluster. The stream is then
re-checked on every store change (and every ``revalidate`` seconds): a
deleted key or cluster ends it with PERMISSION_DENIED, and the calls waiting
on it fail at once.

Three tasks per stream: the reader (replies to their calls, inventory
reports to the inventory service, heartbeats), the writer (the session's
outbox to the agent) and the guard (revocation).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from agent.contract import TUNNEL_AUDIENCE
from meshplane.distribution_contract import NodeIdentity
from meshplane.proto.tunnel.v1 import tunnel_pb2 as pb
from meshplane.proto.tunnel.v1 import tunnel_pb2_grpc as pb_grpc
from mgmt_api import fqn as fqnmod
from mgmt_api.distribution.feed import ChangeFeed
from mgmt_api.distribution.hub import REVALIDATE_SECONDS, Distribution
from mgmt_api.distribution.streams import StillAdmitted, admit_bearer
from mgmt_api.domain import cluster_accounts
from mgmt_api.domain.cluster_accounts import AGENT_KIND
from mgmt_api.service.inventory import InventoryService
from mgmt_api.service.stream_auth import AuthError, Revocation, StreamAuth
from mgmt_api.service.tunnel_hub import AgentSession, TunnelHub

log = logging.getLogger(__name__)

# (token, node, audience) → the grant (key id), or AuthError.
Authenticate = Callable[[str, NodeIdentity, str], Awaitable[str]]
# (organization, cluster, report JSON) → "" when stored, else why not.
ReportInventory = Callable[[str, str, bytes], Awaitable[str]]


class TunnelServicer(pb_grpc.AgentTunnelServicer):
    def __init__(
        self,
        hub: TunnelHub,
        *,
        authenticate: Authenticate,
        still_admitted: StillAdmitted,
        feed: Callable[[], ChangeFeed | None],
        report_inventory: ReportInventory,
        revalidate: float = 5.0,
    ) -> None:
        self._hub = hub
        self._authenticate = authenticate
        self._still_admitted = still_admitted
        self._feed = feed
        self._report = report_inventory
        self._revalidate = revalidate

    async def _admit(
        self,
        first: pb.AgentMessage,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> tuple[NodeIdentity, str, pb.AgentHello]:
        hello = first.hello
        if first.WhichOneof("message") != "hello" or not hello.organization or not hello.cluster:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "the first message must be a hello naming organization and cluster",
            )
        node = NodeIdentity(
            AGENT_KIND, hello.organization, hello.cluster, hello.instance or context.peer()
        )
        grant = await admit_bearer(
            context, lambda token: self._authenticate(token, node, TUNNEL_AUDIENCE)
        )
        return node, grant, hello

    async def Connect(
        self,
        request_iterator: AsyncIterator[pb.AgentMessage],
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> None:
        try:
            first = await anext(aiter(request_iterator))
        except StopAsyncIteration:
            return
        node, grant, hello = await self._admit(first, context)
        await context.send_initial_metadata(())
        session = AgentSession(node.organization, node.cluster, node.instance, hello.version)
        self._hub.attach(session)
        log.info(
            "agent connected",
            extra={"cluster": node.cluster, "instance": node.instance, "version": hello.version},
        )
        tasks = {
            asyncio.create_task(self._read(session, request_iterator)),
            asyncio.create_task(self._write(session, context)),
            guard := asyncio.create_task(self._guard(session, node, grant)),
        }
        revoked: Revocation | None = None
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if guard in done and not guard.cancelled():
                revoked = guard.result()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            reason = revoked.reason if revoked else "the agent disconnected"
            self._hub.detach(session, f"the agent of the cluster went away: {reason}")
            log.info(
                "agent disconnected",
                extra={"cluster": node.cluster, "instance": node.instance, "reason": reason},
            )
        if revoked is not None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, revoked.reason)

    async def _read(self, session: AgentSession, requests: AsyncIterator[pb.AgentMessage]) -> None:
        """Replies go to their calls at once; an inventory report is stored by a task
        of its own, so a slow store write never holds up diagnostics replies."""
        storing: asyncio.Task[None] | None = None
        try:
            async for message in requests:
                session.last_contact = time.time()
                kind = message.WhichOneof("message")
                if kind == "reply":
                    session.deliver(message.reply)
                elif kind == "inventory":
                    if storing is not None:
                        await storing  # one report at a time, in order
                    storing = asyncio.create_task(self._store(session, message.inventory))
        finally:
            if storing is not None:
                storing.cancel()

    async def _store(self, session: AgentSession, inventory: pb.Inventory) -> None:
        error = await self._report(session.organization, session.cluster, inventory.report_json)
        result = pb.InventoryResult(sequence=inventory.sequence, error=error)
        session.outbox.put_nowait(pb.ServerMessage(inventory_result=result))

    async def _write(
        self,
        session: AgentSession,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> None:
        while True:
            message = await session.outbox.get()
            await context.write(message)

    async def _guard(self, session: AgentSession, node: NodeIdentity, grant: str) -> Revocation:
        """Return when the stream's credentials stop holding (never otherwise)."""
        while True:
            feed = self._feed()
            revision = feed.revision if feed is not None else 0
            revoked = await self._still_admitted(grant, node)
            if revoked is not None:
                return revoked
            if feed is None:
                await asyncio.sleep(self._revalidate)
            else:
                with contextlib.suppress(asyncio.TimeoutError):
                    await feed.wait_beyond(revision, self._revalidate)


def tunnel_servicer(
    distribution: Distribution, hub: TunnelHub, inventory: InventoryService
) -> Callable[[grpc.aio.Server], None]:
    """Adds the tunnel to the distribution plane's gRPC server (same port, same TLS),
    admitting streams as the policy stream does (with the tunnel's own audience) and
    waking on its change feed."""
    auth: StreamAuth = distribution.stream_auth

    async def authenticate(token: str, node: NodeIdentity, audience: str) -> str:
        channel = cluster_accounts.channel_for(audience, node.kind)
        if channel is None:
            raise AuthError(f"no cluster credential opens the tunnel as {node.kind!r}")
        return await auth.authenticate_async(token, node.organization, node.cluster, channel)

    async def still_admitted(grant: str, node: NodeIdentity) -> Revocation | None:
        return await auth.still_admitted_async(grant, node.organization, node.cluster)

    async def report(organization: str, cluster: str, body: bytes) -> str:
        cluster_fqn = fqnmod.cluster_fqn(organization, cluster)
        return await asyncio.to_thread(inventory.report_json, cluster_fqn, body)

    def add(server: grpc.aio.Server) -> None:
        servicer = TunnelServicer(
            hub,
            authenticate=authenticate,
            still_admitted=still_admitted,
            feed=lambda: distribution.feed,
            report_inventory=report,
            revalidate=REVALIDATE_SECONDS,
        )
        pb_grpc.add_AgentTunnelServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]

    return add
