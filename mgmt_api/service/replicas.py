"""Several mgmt-api replicas on one database: forwarding tunnel calls, once-per-period jobs.

An agent's tunnel lands on one replica, but a proxytools call may reach any.
Each replica records in the store (:mod:`mgmt_api.store.replicas`) its
internal address and the clusters whose tunnels it holds, refreshed every
:data:`HEARTBEAT_SECONDS` and at once when a tunnel opens or closes. A
replica without the cluster's tunnel forwards the call, already authorized
(and, for ``PUT loggerlevels``, audited by this replica only), to
``POST /internal/v1/tunnelcalls`` of a replica that holds it, signed with
the shared secret for that replica alone, with a fresh nonce
(:mod:`mgmt_api.domain.replicas`; the holder serves a signed call at most
once), and relays the agent's
replies as they come, streams included. Rows older than
:data:`STALE_AFTER_SECONDS` are skipped; a holder that does not answer
(died since its last heartbeat) is skipped for the next one.

While an agent reconnects (its replica died), no live row names its cluster
and calls answer 503 UNAVAILABLE, as with one replica, until the agent's
new tunnel is registered (at once, on connect).

Without a shared secret (``MESHPLANE_REPLICA_SECRET``) nothing is forwarded:
the single-replica shape.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import secrets
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import httpx

from agent.contract import StatusCode
from meshplane.aio import wait_event
from meshplane.proto.tunnel.v1 import tunnel_pb2 as pb
from mgmt_api import fqn as fqnmod
from mgmt_api.domain import replicas as rules
from mgmt_api.errors import ApiError, Code
from mgmt_api.store import replicas as registry
from mgmt_api.store.uow import UnitOfWork

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 2.0
STALE_AFTER_SECONDS = 3 * HEARTBEAT_SECONDS
FORWARD_PATH = "/internal/v1/tunnelcalls"
MAX_FORWARD_BODY_BYTES = 64 * 1024
CONNECT_SECONDS = 5.0


class RemoteHandle:
    """The replies of a call answered through another replica (a ``CallHandle`` look-alike)."""

    def __init__(self, response: httpx.Response) -> None:
        self._chunks = response.aiter_raw()
        self._reader = rules.FrameReader()
        self._ready: list[bytes] = []
        self._done = False

    async def next(self) -> pb.Reply:
        if self._done:
            raise RuntimeError("the call is done")
        while not self._ready:
            try:
                self._ready.extend(self._reader.feed(await anext(self._chunks)))
            except (StopAsyncIteration, httpx.HTTPError, ValueError):
                self._done = True
                status = pb.Status(
                    code=int(StatusCode.UNAVAILABLE),
                    message="the replica holding the agent's tunnel went away",
                )
                return pb.Reply(done=status)
        reply = pb.Reply.FromString(self._ready.pop(0))
        self._done = reply.WhichOneof("kind") == "done"
        return reply


def peer_tls(ca_file: str | None) -> ssl.SSLContext | bool:
    """How the forwarding hop checks a peer's HTTPS certificate.

    With ``ca_file``: the chain must lead to that CA (the cluster's own), but
    the host name is not checked, since a peer is reached by its pod IP.
    Without: the system's CAs and the host name, as any HTTPS client.
    """
    if ca_file is None:
        return True
    context = ssl.create_default_context(cafile=ca_file)
    context.check_hostname = False
    return context


class ReplicaPeers:
    """This replica's row in the registry, and calls forwarded to the other replicas."""

    def __init__(
        self,
        uow: UnitOfWork,
        *,
        secret: bytes,
        address: str,
        clusters: Callable[[], list[str]],
        clock: Callable[[], float] = time.time,
        ca_file: str | None = None,
    ) -> None:
        self.uow = uow
        self.secret = secret
        self.address = address.rstrip("/")
        self.replica_id = uuid.uuid4().hex
        self._clusters = clusters
        self._clock = clock
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._nonces = rules.NonceCache()
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(CONNECT_SECONDS, read=None),
            trust_env=False,
            verify=peer_tls(ca_file),
        )

    # ---- the registry --------------------------------------------------------------------

    def tunnels_changed(self) -> None:
        """A tunnel opened or closed: refresh the row now (not at the next heartbeat)."""
        self._changed.set()

    async def start(self) -> None:
        await self._beat()
        self._task = asyncio.create_task(self._heartbeat())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            await asyncio.to_thread(registry.forget, self.uow, self.replica_id)
        await self._http.aclose()

    async def _beat(self) -> None:
        clusters = self._clusters()
        await asyncio.to_thread(
            registry.heartbeat, self.uow, self.replica_id, self.address, clusters, self._clock()
        )

    async def _heartbeat(self) -> None:
        while True:
            await wait_event(self._changed, HEARTBEAT_SECONDS)
            self._changed.clear()
            try:
                await self._beat()
            except Exception as exc:  # a store outage must not end the heartbeat
                log.warning("replica heartbeat failed", extra={"error": type(exc).__name__})

    # ---- forwarding ----------------------------------------------------------------------

    def _request(self, organization: str, cluster: str, call: pb.Call, caller: str) -> bytes:
        return json.dumps(
            {
                "organization": organization,
                "cluster": cluster,
                "caller": caller,
                "from": self.replica_id,
                "call": base64.b64encode(call.SerializeToString()).decode(),
            }
        ).encode()

    @asynccontextmanager
    async def forward(
        self, organization: str, cluster: str, call: pb.Call, caller: str
    ) -> AsyncIterator[RemoteHandle]:
        """The call answered by a live replica that holds the cluster's tunnel; 503 when none."""
        name = fqnmod.cluster_fqn(organization, cluster)
        fresh_since = self._clock() - STALE_AFTER_SECONDS
        holders = await asyncio.to_thread(
            registry.holders, self.uow, name, exclude=self.replica_id, fresh_since=fresh_since
        )
        body = self._request(organization, cluster, call, caller)
        hop = rules.Hop("POST", FORWARD_PATH, body)
        for target, address in holders:
            if rules.plain_hop(address):
                log.warning(
                    "a replica's address is plain HTTP off this machine; not forwarding there",
                    extra={"replica": address},
                )
                continue
            signature = rules.sign(
                self.secret, hop, target=target, now=self._clock(), nonce=secrets.token_hex(16)
            )
            headers = {rules.SIGNATURE_HEADER: signature, "content-type": "application/json"}
            request = self._http.build_request(
                "POST", address + FORWARD_PATH, content=body, headers=headers
            )
            try:
                response = await self._http.send(request, stream=True)
            except httpx.HTTPError as exc:
                log.warning(
                    "a replica holding the tunnel did not answer; trying the next",
                    extra={"replica": address, "error": type(exc).__name__},
                )
                continue
            try:
                if response.status_code == 200:
                    yield RemoteHandle(response)
                    return
                await response.aread()
                log.warning(
                    "a replica refused a forwarded call; trying the next",
                    extra={"replica": address, "status": response.status_code},
                )
            finally:
                await response.aclose()
        raise ApiError(
            Code.UNAVAILABLE,
            f"no agent of cluster {name} is connected; start meshplane-agent there "
            "(docs/agent.md) or check its logs",
            metadata={"cluster": name},
        )

    def admit(
        self, signature: str | None, method: str, path: str, body: bytes
    ) -> dict[str, object]:
        """The forwarded request of another replica; 401 unless signed with the shared secret
        for this replica, within the window, and never seen before."""
        now = self._clock()
        outcome: rules.Signature | rules.Refusal = rules.Refusal.MALFORMED
        if len(body) <= MAX_FORWARD_BODY_BYTES:
            outcome = rules.verify(
                self.secret, signature, rules.Hop(method, path, body), self.replica_id, now
            )
        if isinstance(outcome, rules.Signature):
            outcome = self._nonces.admit(outcome, now) or outcome
        if isinstance(outcome, rules.Refusal):
            log.warning("a forwarded call was refused", extra={"reason": str(outcome)})
            raise ApiError(Code.UNAUTHENTICATED, "not a signed request of a meshplane replica")
        try:
            request = json.loads(body)
            call = pb.Call.FromString(base64.b64decode(request["call"], validate=True))
            fields = {k: str(request[k]) for k in ("organization", "cluster", "caller")}
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise ApiError(
                Code.INVALID_ARGUMENT, f"malformed forwarded call: {type(exc).__name__}"
            ) from None
        return {**fields, "call": call}


# ---- periodic jobs -----------------------------------------------------------------------

Claim = Callable[[str, int], bool]


def store_claim(uow: UnitOfWork, replica: str, clock: Callable[[], float] = time.time) -> Claim:
    """(job, period) → whether this replica runs it, recorded in the store."""

    def claim(job: str, period: int) -> bool:
        if not registry.claim_period(uow, job, period, replica, clock()):
            return False
        registry.purge_claims(uow, job, period - 100)
        return True

    return claim


async def run_each_period(
    job: str,
    interval: float,
    body: Callable[[], Awaitable[None]],
    *,
    claim: Claim,
    stop: asyncio.Event,
    clock: Callable[[], float] = time.time,
) -> None:
    """Run ``body`` when this replica starts, then once per ``interval``-long period across
    every replica, until ``stop``.

    The run at start is every replica's own (a restart picks up what changed
    at once); it also claims the current period, so the others do not repeat
    it. Then each replica wakes at each period's start and tries to claim it;
    the one that does runs the job. A replica that is down leaves its periods
    to the others; a job that crashes is logged and the next period runs again.
    """
    await _run(job, body, claim, rules.period_of(clock(), interval), at_start=True)
    while not stop.is_set():
        delay = max(0.0, rules.next_period_start(clock(), interval) - clock())
        await wait_event(stop, delay)
        if not stop.is_set():
            await _run(job, body, claim, rules.period_of(clock(), interval), at_start=False)


async def _run(
    job: str, body: Callable[[], Awaitable[None]], claim: Claim, period: int, *, at_start: bool
) -> None:
    try:
        claimed = await asyncio.to_thread(claim, job, period)
        if at_start:
            log.info("periodic job ran at start", extra={"job": job, "period": period})
        elif claimed:
            log.info("periodic job ran", extra={"job": job, "period": period})
        else:
            log.debug("periodic job: another replica runs it", extra={"job": job})
            return
        await body()
    except Exception:
        log.exception("periodic job %s failed", job)
