"""The agent's end of the tunnel: dial out, stay connected, answer calls.

One gRPC bidirectional stream (``AgentTunnel.Connect``) to the management
plane, opened from inside the cluster, so the cluster needs no inbound
port. Over it:

- up: a hello, the inventory (right after connecting, whenever it changes,
  and at least every :data:`INVENTORY_REFRESH_SECONDS` so the cluster does not
  turn stale), the replies of diagnostics calls, and a heartbeat when idle;
- down: calls, each run as its own task (at most ``max_concurrent`` at once,
  beyond that RESOURCE_EXHAUSTED at once), and cancellations (the REST
  client went away: its log stream stops here too).

The stream is re-opened with jittered backoff (:class:`meshplane.backoff.Backoff`)
whenever it ends, each time with a fresh short-lived token for the tunnel
audience. TLS and mTLS are the policy stream's (``--control-plane grpcs://``,
``--control-plane-ca``, ``--control-plane-cert``/``-key``). Replies wait in a
bounded queue: a slow management plane slows the log readers down (gRPC flow
control) instead of growing memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import TypeVar

import grpc
from opentelemetry.trace import Span, SpanKind

from agent.contract import StatusCode
from agent.diagnostics import Diagnostics
from agent.discovery import ProxySource
from agent.metrics import AgentMetrics
from agent.replies import Replies, done_reply
from meshplane.aio import wait_event
from meshplane.backoff import Backoff
from meshplane.distribution_client import CHANNEL_OPTIONS, REFUSED
from meshplane.proto.tunnel.v1 import tunnel_pb2 as pb
from meshplane.proto.tunnel.v1 import tunnel_pb2_grpc as pb_grpc
from meshplane.tracing import Tracing, parent_context

log = logging.getLogger(__name__)
T = TypeVar("T")

HEARTBEAT_SECONDS = 10.0
INVENTORY_SECONDS = 15.0  # how often discovery is asked for the inventory
INVENTORY_REFRESH_SECONDS = 60.0  # an unchanged report is re-sent this often
OUTBOX_SIZE = 1024
# Large enough for a config dump chunk (256 KiB) with room to spare.
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
TUNNEL_CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    *CHANNEL_OPTIONS,
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
)


class Tunnel:
    def __init__(
        self,
        *,
        address: str,
        hello: pb.AgentHello,
        token: Callable[[], str],
        diagnostics: Diagnostics,
        source: ProxySource,
        metrics: AgentMetrics,
        channel_credentials: grpc.ChannelCredentials | None = None,
        max_concurrent: int = 64,
        max_backoff: float = 15.0,
        heartbeat: float = HEARTBEAT_SECONDS,
        inventory_every: float = INVENTORY_SECONDS,
        tracing: Tracing | None = None,
    ) -> None:
        self.tracing = tracing
        self.address = address
        self.hello = hello
        self.token = token
        self.diagnostics = diagnostics
        self.source = source
        self.metrics = metrics
        self.channel_credentials = channel_credentials
        self.max_concurrent = max_concurrent
        self.max_backoff = max_backoff
        self.heartbeat = heartbeat
        self.inventory_every = inventory_every
        self.connected = False
        self._calls: dict[int, asyncio.Task[None]] = {}
        self._streams: set[int] = set()  # the calls that are log streams
        self._draining = False

    # ---- the connection loop ---------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Stay connected until ``stop`` is set, reconnecting with backoff.

        ``stop`` ends whatever is in flight at once (a connect to a server that
        never answers, a refused stream) and drains an open stream; either way
        this returns normally, so SIGTERM always exits 0.
        """
        backoff = Backoff(self.max_backoff)
        while not stop.is_set():
            failure: BaseException | None = None
            try:
                await self.run_once(stop)
            except grpc.aio.AioRpcError as exc:
                failure = exc
                self.metrics.connects.labels(exc.code().name).inc()
                if exc.code() in REFUSED:
                    backoff.refused()
            except Exception as exc:
                failure = exc
                log.error("tunnel session crashed", exc_info=exc)
            if stop.is_set():
                return
            if failure is None:  # the management plane closed the stream
                backoff.reset()
                self.metrics.connects.labels("ok").inc()
            wait = backoff.next_wait()
            if failure is not None:
                self._log_failure(failure, wait)
            await wait_event(stop, wait)

    @staticmethod
    def _log_failure(failure: BaseException, wait: float) -> None:
        rpc = failure if isinstance(failure, grpc.aio.AioRpcError) else None
        log.warning(
            "tunnel to the management plane failed; retrying",
            extra={
                "code": rpc.code().name if rpc else type(failure).__name__,
                "detail": rpc.details() if rpc else "",
                "retry_in": round(wait, 2),
                # the event loop's tasks, the same between attempts: none is left behind
                "tasks": len(asyncio.all_tasks()),
            },
        )

    async def run_once(self, stop: asyncio.Event) -> None:
        """One stream: hello, then serve calls until it ends (or ``stop``: drain).

        Every task it starts ends before it returns, whatever the stream did:
        the writer (the agent's own, not a request iterator, which gRPC leaves
        waiting forever when the server refuses the stream), the heartbeat and
        inventory senders, and the calls.
        """
        metadata = (("authorization", f"Bearer {self.token()}"),)
        if self.channel_credentials is not None:
            channel = grpc.aio.secure_channel(
                self.address, self.channel_credentials, TUNNEL_CHANNEL_OPTIONS
            )
        else:
            channel = grpc.aio.insecure_channel(self.address, TUNNEL_CHANNEL_OPTIONS)
        async with channel:
            stub = pb_grpc.AgentTunnelStub(channel)  # type: ignore[no-untyped-call]
            outbox: asyncio.Queue[pb.AgentMessage] = asyncio.Queue(OUTBOX_SIZE)
            outbox.put_nowait(pb.AgentMessage(hello=self.hello))
            call = stub.Connect(metadata=metadata)
            helpers = [asyncio.create_task(self._write(call, outbox))]
            try:
                if not await _unless_stopped(call.initial_metadata(), stop):
                    return  # stopped before the stream opened: nothing to drain
                if call.done():  # refused: the loop below raises its status
                    async for _ in call:
                        pass
                    return
                self._set_connected(True)
                log.info("tunnel connected", extra={"address": self.address})
                helpers += [
                    asyncio.create_task(self._heartbeats(outbox)),
                    asyncio.create_task(self._inventory(outbox)),
                ]
                reader = asyncio.create_task(self._serve(call, outbox))
                helpers.append(reader)
                if await _unless_stopped(asyncio.shield(reader), stop):
                    return
                await self._drain()
            finally:
                self._set_connected(False)
                call.cancel()
                for task in (*helpers, *self._calls.values()):
                    task.cancel()
                await asyncio.gather(*helpers, *self._calls.values(), return_exceptions=True)
                self._calls.clear()

    def _set_connected(self, up: bool) -> None:
        self.connected = up
        self.metrics.connected.set(1 if up else 0)

    async def _write(
        self,
        call: grpc.aio.StreamStreamCall[pb.AgentMessage, pb.ServerMessage],
        outbox: asyncio.Queue[pb.AgentMessage],
    ) -> None:
        """Send what is queued, in order, for as long as the stream lives."""
        while True:
            await call.write(await outbox.get())

    async def _serve(
        self,
        call: grpc.aio.StreamStreamCall[pb.AgentMessage, pb.ServerMessage],
        outbox: asyncio.Queue[pb.AgentMessage],
    ) -> None:
        async for message in call:
            kind = message.WhichOneof("message")
            if kind == "call":
                self._start_call(message.call, outbox)
            elif kind == "cancel":
                task = self._calls.get(message.cancel.id)
                if task is not None:
                    task.cancel()
            elif kind == "inventory_result":
                result = message.inventory_result
                self.metrics.inventory.labels("error" if result.error else "ok").inc()
                if result.error:
                    log.error("inventory report refused", extra={"error": result.error[:500]})

    # ---- calls -----------------------------------------------------------

    def _start_call(self, call: pb.Call, outbox: asyncio.Queue[pb.AgentMessage]) -> None:
        operation = call.WhichOneof("operation") or "unknown"

        async def put(reply: pb.Reply) -> None:
            await outbox.put(pb.AgentMessage(reply=reply))

        replies = Replies(call.id, put)
        if self._draining or len(self._calls) >= self.max_concurrent:
            why = "draining" if self._draining else f"{self.max_concurrent} calls in progress"
            reply = done_reply(
                call.id, StatusCode.RESOURCE_EXHAUSTED, f"the agent is busy ({why}); retry"
            )
            self.metrics.calls.labels(operation, StatusCode.RESOURCE_EXHAUSTED.name).inc()
            with contextlib.suppress(asyncio.QueueFull):
                outbox.put_nowait(pb.AgentMessage(reply=reply))
            return

        async def run() -> None:
            started = time.monotonic()
            self.metrics.active.labels(operation).inc()
            code = "OK"
            with self._span(call, operation) as span:
                try:
                    await self.diagnostics.run(call, replies)
                except asyncio.CancelledError:
                    code = StatusCode.CANCELLED.name
                    raise
                except Exception:
                    code = StatusCode.INTERNAL.name
                    log.exception("diagnostics call crashed", extra={"operation": operation})
                    await replies.done(StatusCode.INTERNAL, "the agent failed")
                finally:
                    self.metrics.active.labels(operation).dec()
                    self.metrics.calls.labels(operation, code).inc()
                    if operation != "stream_logs":
                        self.metrics.duration.labels(operation).observe(time.monotonic() - started)
                    self._calls.pop(call.id, None)
                    self._streams.discard(call.id)
                    if span is not None:
                        span.set_attribute("meshplane.outcome", code)

        self._calls[call.id] = asyncio.create_task(run())
        if operation == "stream_logs":
            self._streams.add(call.id)

    def _span(self, call: pb.Call, operation: str) -> AbstractContextManager[Span | None]:
        """One SERVER span per call when tracing is on and the gate samples it,
        continuing the management plane's span (the call's ``traceparent``).
        Attributes name the operation and the workload, never what it answers."""
        tracing = self.tracing
        if tracing is None or not tracing.gate(call.traceparent or None):
            return contextlib.nullcontext()
        return tracing.tracer.start_as_current_span(
            f"agent tunnel {operation}",
            context=parent_context(call.traceparent or None, call.tracestate or None),
            kind=SpanKind.SERVER,
            attributes={
                "meshplane.operation": operation,
                "meshplane.namespace": call.target.namespace,
                "meshplane.workload": call.target.workload,
            },
        )

    async def _drain(self, grace: float = 5.0) -> None:
        """SIGTERM: refuse new calls, end log streams, give unary calls ``grace`` to finish."""
        self._draining = True
        for call_id in self._streams:
            task = self._calls.get(call_id)
            if task is not None:
                task.cancel()
        pending = [t for t in self._calls.values() if not t.done()]
        if pending:
            _done, late = await asyncio.wait(pending, timeout=grace)
            for task in late:
                task.cancel()

    # ---- background messages ---------------------------------------------

    async def _heartbeats(self, outbox: asyncio.Queue[pb.AgentMessage]) -> None:
        while True:
            await asyncio.sleep(self.heartbeat)
            await outbox.put(pb.AgentMessage(heartbeat=pb.Heartbeat()))

    async def _inventory(self, outbox: asyncio.Queue[pb.AgentMessage]) -> None:
        """Send the inventory now, then when it changes (or is due as a heartbeat)."""
        sequence = 0
        last_digest = ""
        last_sent = 0.0
        while True:
            try:
                proxies = await self.source.proxies()
                self.metrics.proxies.set(len(proxies))
                report = await self.source.inventory()
            except Exception as exc:
                log.warning("cannot build the inventory", extra={"error": str(exc)[:500]})
            else:
                body = json.dumps(report, sort_keys=True, separators=(",", ":")).encode()
                digest = hashlib.sha256(body).hexdigest()
                now = time.monotonic()
                if digest != last_digest or now - last_sent >= INVENTORY_REFRESH_SECONDS:
                    sequence += 1
                    message = pb.Inventory(report_json=body, sequence=sequence)
                    await outbox.put(pb.AgentMessage(inventory=message))
                    last_digest, last_sent = digest, now
            await asyncio.sleep(self.inventory_every)


async def _unless_stopped(work: Awaitable[T], stop: asyncio.Event) -> bool:
    """Await ``work`` unless ``stop`` is set first (then cancel it): whether it finished.

    Its exception, if any, is raised. Nothing it starts outlives it.
    """
    task = asyncio.ensure_future(work)
    stopper = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
        if not task.done():
            task.cancel()
        await asyncio.gather(task, stopper, return_exceptions=True)
    if task.cancelled():
        return False
    task.result()
    return True
