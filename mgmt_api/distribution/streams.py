"""What every long-lived stream of the distribution plane does the same way.

The policy stream (:mod:`mgmt_api.distribution.server`), the gateways' ADS
(:mod:`mgmt_api.distribution.ads`) and the agent tunnel
(:mod:`mgmt_api.distribution.tunnel`) all admit a bearer token for one
cluster, re-check it whenever they wake, and end the same way: the registry
told, a deleted cluster's rows dropped, and a revoked stream closed with
PERMISSION_DENIED and the reason. One copy here, so the three cannot drift.

The policy stream and ADS also share their loop (:func:`follow`): build on
every wake-up of the change feed (a write, or ``heartbeat`` seconds without
one), send what a new build calls for, answer the client's requests between
builds, and end when the client does or the credentials no longer hold.
What differs (what a build is, what to send for it, what a request means) is
theirs, passed in as three functions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import grpc

from meshplane.distribution_contract import NodeIdentity
from mgmt_api.distribution.feed import ChangeFeed
from mgmt_api.service.enforcement import UnknownCluster
from mgmt_api.service.instances import SubscriberRegistry
from mgmt_api.service.stream_auth import AuthError, Revocation

log = logging.getLogger(__name__)

T = TypeVar("T")
Req = TypeVar("Req")
Out = TypeVar("Out")
# (grant, node) → None while the grant holds, else why it no longer does.
StillAdmitted = Callable[[str, NodeIdentity], Awaitable[Revocation | None]]
Context = grpc.aio.ServicerContext[Any, Any]


async def admit_bearer(context: Context, authenticate: Callable[[str], Awaitable[str]]) -> str:
    """The stream's ``authorization: Bearer`` token, admitted: its grant (the key id).

    Aborts the call with UNAUTHENTICATED without a token and PERMISSION_DENIED
    when ``authenticate`` refuses it.
    """
    metadata = dict(context.invocation_metadata() or ())
    scheme, _, token = str(metadata.get("authorization", "")).partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "a bearer token is required")
    try:
        return await authenticate(token.strip())
    except AuthError as exc:
        await _abort(context, grpc.StatusCode.PERMISSION_DENIED, str(exc))


async def _abort(context: Context, code: grpc.StatusCode, details: str) -> NoReturn:
    await context.abort(code, details)
    raise AssertionError("abort returned")  # pragma: no cover - abort raises


async def fresh(
    build: Awaitable[T],
    still_admitted: StillAdmitted | None,
    grant: str,
    node: NodeIdentity,
) -> T | Revocation:
    """``build``, then whether the stream's credentials still hold.

    Checked after the build: a cluster deleted before the build read the store
    compiles to an empty configuration (no limits, no policies, no routes),
    which must never be sent; this check sees that deletion too.
    """
    try:
        value = await build
    except UnknownCluster:
        return Revocation("the cluster was deleted", cluster_gone=True)
    if still_admitted is not None:
        revoked = await still_admitted(grant, node)
        if revoked is not None:
            return revoked
    return value


async def cancel(*tasks: asyncio.Task[object] | None) -> None:
    """Cancel and reap a stream's helper tasks, whatever they were doing."""
    for task in tasks:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def connected(registry: SubscriberRegistry, node: NodeIdentity, version: str, now: float) -> int:
    """The registry's side of a stream's start; its number for :func:`ended`."""
    stream = registry.connected(node, version, now)
    log.info(
        "stream connected",
        extra={"kind": node.kind, "cluster": node.cluster, "instance": node.instance},
    )
    return stream


def ended(
    registry: SubscriberRegistry,
    node: NodeIdentity,
    now: float,
    stream: int,
    revoked: Revocation | None,
) -> None:
    """The registry's side of a stream's end (see :meth:`SubscriberRegistry.disconnected`)."""
    registry.disconnected(node, now, stream)
    if revoked is not None and revoked.cluster_gone:
        registry.forget_cluster(node.organization, node.cluster)
    log.info(
        "stream disconnected",
        extra={"kind": node.kind, "cluster": node.cluster, "instance": node.instance},
    )


async def refuse(context: Context, node: NodeIdentity, revoked: Revocation) -> None:
    """Close a stream whose credentials no longer hold, saying why."""
    log.warning(
        "stream closed: its credentials no longer hold",
        extra={
            "kind": node.kind,
            "cluster": node.cluster,
            "instance": node.instance,
            "reason": revoked.reason,
        },
    )
    await context.abort(grpc.StatusCode.PERMISSION_DENIED, revoked.reason)


@dataclass(frozen=True)
class StreamPlane:
    """What every stream of one servicer shares."""

    feed: ChangeFeed
    registry: SubscriberRegistry
    still_admitted: StillAdmitted | None
    clock: Callable[[], float]
    heartbeat: float  # seconds between wake-ups without a write


@dataclass(frozen=True)
class Admitted:
    """One admitted stream: who it is and its grant (see :func:`admit_bearer`)."""

    node: NodeIdentity
    grant: str
    context: Context


async def follow(
    plane: StreamPlane,
    admitted: Admitted,
    requests: AsyncIterator[Req],
    *,
    version: str,
    build: Callable[[int], Awaitable[T]],
    on_build: Callable[[T], Sequence[Out] | None],
    on_request: Callable[[Req], Sequence[Out]],
    queued: Sequence[Req] = (),
) -> AsyncGenerator[Out, None]:
    """The loop of a stream that follows the change feed; what it yields is sent.

    The registry hears of the stream first (the client says it runs
    ``version``, or ``""``). At the start and on every wake-up of the feed,
    ``build(revision)``, then :func:`fresh`'s check of the credentials;
    ``on_build`` says what the new build calls for (``None``: nothing to
    serve yet, so requests wait for the next build). Between builds each
    request (``queued`` ones first, every queued one before the next build) goes
    to ``on_request``. The stream ends
    when the client ends its side, or with PERMISSION_DENIED when the
    credentials no longer hold; either way the registry is told
    (:func:`ended`). Use it under :func:`contextlib.aclosing`, so a
    cancelled call ends it at once.
    """
    node = admitted.node
    stream = connected(plane.registry, node, version, plane.clock())
    inbox: asyncio.Queue[Req | None] = asyncio.Queue()
    for early in queued:
        inbox.put_nowait(early)
    reader = asyncio.create_task(read_requests(requests, inbox))
    getter: asyncio.Task[Req | None] | None = None
    waiter: asyncio.Task[int] | None = None
    revoked: Revocation | None = None
    serving = False
    revision = plane.feed.revision
    try:
        while True:
            if not serving or (waiter is not None and waiter.done()):
                waiter = None
                revision = plane.feed.revision
                checked = await fresh(build(revision), plane.still_admitted, admitted.grant, node)
                if isinstance(checked, Revocation):
                    revoked = checked
                    break
                sends = on_build(checked)
                if sends is None:  # nothing to serve yet: build again on the next change
                    await plane.feed.wait_beyond(revision, plane.heartbeat)
                    continue
                serving = True
                for message in sends:
                    yield message
            getter = getter or asyncio.create_task(inbox.get())
            waiter = waiter or asyncio.create_task(
                plane.feed.wait_beyond(revision, plane.heartbeat)
            )
            await asyncio.wait({getter, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                request, getter = getter.result(), None
                # Every request queued so far before the next build: none waits
                # behind a stream of wake-ups (a join storm), however many ACKs
                # are ahead of it.
                pending = [request]
                while pending[-1] is not None and not inbox.empty():
                    pending.append(inbox.get_nowait())
                for each in pending:
                    if each is None:
                        break
                    for message in on_request(each):
                        yield message
                if pending[-1] is None:
                    break  # the client ended the stream
    finally:
        await cancel(getter, waiter, reader)
        ended(plane.registry, node, plane.clock(), stream, revoked)
    if revoked is not None:
        await refuse(admitted.context, node, revoked)


async def read_requests(requests: AsyncIterator[Req], inbox: asyncio.Queue[Any]) -> None:
    """The client's requests into ``inbox``; None when the stream ends, however it ends."""
    try:
        async for request in requests:
            inbox.put_nowait(request)
    finally:
        inbox.put_nowait(None)
