"""Which agents are connected, and routing a diagnostics call to one of them.

Each open tunnel is an :class:`AgentSession`: an outbox of messages for the
agent and the calls waiting for its replies. :meth:`TunnelHub.open_call`
picks a connected agent of the cluster (round robin when a cluster runs
several), gives the call a fresh id and yields a :class:`CallHandle` to read
the replies from. Leaving the block before the agent said ``done`` (the REST
client went away, the deadline passed) sends the agent a ``Cancel``, so a
log stream stops being tailed as soon as nobody reads it.

When a tunnel closes, every call still waiting on it ends with UNAVAILABLE
at once instead of waiting for its deadline.

With several replicas, a call for a cluster whose tunnel this replica does
not hold goes to ``forward`` (:class:`mgmt_api.service.replicas.ReplicaPeers`),
which relays it to the replica that holds it; ``on_change`` tells the replica
registry when a tunnel opens or closes.

Replies wait in a queue per call. A REST client that reads a log stream
more slowly than the proxy writes would let that queue grow without bound;
past :data:`MAX_QUEUED_REPLIES` the call is cancelled with RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Protocol

from agent.contract import StatusCode
from meshplane.proto.tunnel.v1 import tunnel_pb2 as pb
from mgmt_api import fqn as fqnmod
from mgmt_api.errors import ApiError, Code

MAX_QUEUED_REPLIES = 10_000


def _status(code: StatusCode, message: str) -> pb.Status:
    return pb.Status(code=int(code), message=message)


@dataclass
class _Pending:
    replies: asyncio.Queue[pb.Reply] = field(default_factory=asyncio.Queue)
    finished: bool = False


class AgentSession:
    """One connected agent (one open tunnel)."""

    def __init__(self, organization: str, cluster: str, instance: str, version: str) -> None:
        self.organization = organization
        self.cluster = cluster
        self.instance = instance
        self.version = version
        self.connected_at = time.time()
        self.last_contact = self.connected_at
        self.outbox: asyncio.Queue[pb.ServerMessage] = asyncio.Queue()
        self.calls: dict[int, _Pending] = {}
        self.closed = False

    def deliver(self, reply: pb.Reply) -> None:
        """A reply from the agent, to the call waiting for it (late ones are dropped)."""
        pending = self.calls.get(reply.id)
        if pending is None or pending.finished:
            return
        if pending.replies.qsize() >= MAX_QUEUED_REPLIES:
            pending.finished = True
            self.outbox.put_nowait(pb.ServerMessage(cancel=pb.Cancel(id=reply.id)))
            message = "the client reads the answer more slowly than the proxy writes it"
            pending.replies.put_nowait(
                pb.Reply(id=reply.id, done=_status(StatusCode.RESOURCE_EXHAUSTED, message))
            )
            return
        if reply.WhichOneof("kind") == "done":
            pending.finished = True
        pending.replies.put_nowait(reply)

    def close(self, reason: str) -> None:
        """The tunnel ended: every waiting call ends with UNAVAILABLE."""
        self.closed = True
        for call_id, pending in self.calls.items():
            if not pending.finished:
                pending.finished = True
                pending.replies.put_nowait(
                    pb.Reply(id=call_id, done=_status(StatusCode.UNAVAILABLE, reason))
                )


class Replies(Protocol):
    """Where a call's replies are read from: a local tunnel or another replica."""

    async def next(self) -> pb.Reply: ...


# (organization, cluster, call, caller) → the call answered through another replica.
Forward = Callable[[str, str, pb.Call, str], AbstractAsyncContextManager[Replies]]


class CallHandle:
    def __init__(self, session: AgentSession, call_id: int, pending: _Pending) -> None:
        self.session = session
        self.id = call_id
        self._pending = pending

    async def next(self) -> pb.Reply:
        return await self._pending.replies.get()


class TunnelHub:
    """Thread-unsafe by design: used only from the event loop that serves gRPC and REST."""

    def __init__(self) -> None:
        self._sessions: dict[tuple[str, str], list[AgentSession]] = {}
        self._ids = itertools.count(1)
        self._turn = itertools.count()
        self.forward: Forward | None = None
        self.on_change: Callable[[], None] = lambda: None

    def attach(self, session: AgentSession) -> None:
        self._sessions.setdefault((session.organization, session.cluster), []).append(session)
        self.on_change()

    def detach(self, session: AgentSession, reason: str) -> None:
        key = (session.organization, session.cluster)
        sessions = self._sessions.get(key, [])
        if session in sessions:
            sessions.remove(session)
        if not sessions:
            self._sessions.pop(key, None)
        session.close(reason)
        self.on_change()

    def clusters(self) -> list[str]:
        """The clusters (fqn) with at least one tunnel open here."""
        return [fqnmod.cluster_fqn(org, cluster) for org, cluster in self._sessions]

    def agents(self, organization: str, cluster: str) -> list[AgentSession]:
        return list(self._sessions.get((organization, cluster), []))

    @asynccontextmanager
    async def open_call(
        self,
        organization: str,
        cluster: str,
        call: pb.Call,
        *,
        caller: str = "",
        forward: bool = True,
    ) -> AsyncIterator[Replies]:
        """Send ``call`` to an agent of the cluster, here or (``forward``) through the replica
        that holds its tunnel; 503 UNAVAILABLE when none is connected."""
        sessions = [s for s in self._sessions.get((organization, cluster), []) if not s.closed]
        if not sessions and forward and self.forward is not None:
            async with self.forward(organization, cluster, call, caller) as remote:
                yield remote
            return
        if not sessions:
            name = fqnmod.cluster_fqn(organization, cluster)
            raise ApiError(
                Code.UNAVAILABLE,
                f"no agent of cluster {name} is connected; start meshplane-agent there "
                "(docs/agent.md) or check its logs",
                metadata={"cluster": name},
            )
        session = sessions[next(self._turn) % len(sessions)]
        call_id = next(self._ids)
        call.id = call_id
        pending = _Pending()
        session.calls[call_id] = pending
        session.outbox.put_nowait(pb.ServerMessage(call=call))
        try:
            yield CallHandle(session, call_id, pending)
        finally:
            session.calls.pop(call_id, None)
            if not pending.finished and not session.closed:
                session.outbox.put_nowait(pb.ServerMessage(cancel=pb.Cancel(id=call_id)))
