"""What every long-lived stream of the distribution plane does the same way.

The policy stream (:mod:`mgmt_api.distribution.server`), the gateways' ADS
(:mod:`mgmt_api.distribution.ads`) and the agent tunnel
(:mod:`mgmt_api.distribution.tunnel`) all admit a bearer token for one
cluster, re-check it whenever they wake, and end the same way: the registry
told, a deleted cluster's rows dropped, and a revoked stream closed with
PERMISSION_DENIED and the reason. One copy here, so the three cannot drift.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc

from meshplane.distribution_contract import NodeIdentity
from mgmt_api.service.enforcement import UnknownCluster
from mgmt_api.service.instances import SubscriberRegistry
from mgmt_api.service.stream_auth import AuthError, Revocation

log = logging.getLogger(__name__)

T = TypeVar("T")
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
