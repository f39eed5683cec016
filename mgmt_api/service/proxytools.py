"""The proxy diagnostics service: permission, the call through the tunnel, the answer.

Reads need READ on the cluster, ``PUT loggerlevels`` WRITE on it, and is
audited (operation ``SET_LOGGER_LEVELS``, with what was asked and each
instance's outcome). The agent is given the deadline and gives up on a
proxy after it (DEADLINE_EXCEEDED naming the proxy); mgmt-api waits a
little longer (:data:`AGENT_MARGIN_SECONDS`) for that answer, then answers
504 itself, naming the cluster's agent.

Answers are assembled in memory up to :data:`MAX_RESPONSE_BYTES` (each
proxy's answer is also capped by the agent's ``--max-response-bytes``);
beyond that the request fails with RESOURCE_EXHAUSTED, which says to
narrow it (``resource``, ``mask``, ``filter``, one ``instance``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

from agent import contract
from meshplane.kinds_contract import Kind
from meshplane.proto.tunnel.v1 import tunnel_pb2 as pb
from meshplane.tracing import outgoing_trace_context
from mgmt_api import access as authz
from mgmt_api import fqn as fqnmod
from mgmt_api.access import Principal
from mgmt_api.domain.proxytools import (
    InstanceResult,
    api_error,
    assemble,
    status_view,
    workload_view,
)
from mgmt_api.errors import ApiError, Code, invalid, not_found
from mgmt_api.schemas.proxytools import SetLoggerLevelsRequest, WorkloadSelector
from mgmt_api.service.replicas import ReplicaPeers
from mgmt_api.service.tunnel_hub import Replies, TunnelHub
from mgmt_api.store import repo, sidecars
from mgmt_api.store.uow import UnitOfWork

AGENT_MARGIN_SECONDS = 2.0
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
OK = int(contract.StatusCode.OK)


def check_fields(check: Any, *args: Any) -> None:
    """Run a contract check; its FieldError is a 400 naming the field."""
    try:
        check(*args)
    except contract.FieldError as exc:
        raise invalid(exc.field, exc.message) from None


class ProxyTools:
    def __init__(self, uow: UnitOfWork, hub: TunnelHub, timeout_seconds: float) -> None:
        self.uow = uow
        self.hub = hub
        self.timeout_seconds = timeout_seconds
        #: The other replicas (forwarding); None with one replica (no shared secret).
        self.peers: ReplicaPeers | None = None

    # ---- permission and audit (blocking: call from a worker thread) -----------

    def authorize(self, principal: Principal, organization: str, cluster: str, perm: str) -> None:
        fqn = fqnmod.cluster_fqn(organization, cluster)
        with self.uow.read() as conn:
            authz.require(conn, principal, fqn, Kind.CLUSTER, perm)
            if not repo.exists(conn, fqn):
                raise not_found(fqn)

    def audit_set_levels(
        self,
        principal: Principal,
        organization: str,
        cluster: str,
        request: SetLoggerLevelsRequest,
        outcome: dict[str, str],
    ) -> None:
        fqn = fqnmod.cluster_fqn(organization, cluster)
        what = f"level {request.level}" if request.level else "named loggers"
        target = f"{request.namespace}/{request.workload}"
        with self.uow.write(principal.fqn, bump=False) as tx:
            tx.audit(
                fqn,
                Kind.CLUSTER,
                "SET_LOGGER_LEVELS",
                f"set {what} on the proxies of {target} in {fqn}",
                **request.model_dump(by_alias=True),
                outcome=outcome,
            )

    # ---- calls ---------------------------------------------------------------

    def new_call(self, selector: WorkloadSelector) -> pb.Call:
        check_fields(
            contract.check_workload, selector.namespace, selector.workload, selector.instance
        )
        traceparent, tracestate = outgoing_trace_context()  # the agent's span continues it
        return pb.Call(
            target=pb.Workload(
                namespace=selector.namespace,
                workload=selector.workload,
                instance=selector.instance,
            ),
            timeout_ms=int(self.timeout_seconds * 1000),
            traceparent=traceparent,
            tracestate=tracestate,
        )

    def _deadline_error(self, organization: str, cluster: str) -> ApiError:
        name = fqnmod.cluster_fqn(organization, cluster)
        return ApiError(
            Code.DEADLINE_EXCEEDED,
            f"the agent of cluster {name} did not answer within {self.timeout_seconds:g}s",
            metadata={"cluster": name},
        )

    async def unary(
        self, organization: str, cluster: str, call: pb.Call, caller: str = ""
    ) -> dict[str, Any]:
        """Send the call, collect every instance's answer, assemble the record."""
        try:
            async with asyncio.timeout(self.timeout_seconds + AGENT_MARGIN_SECONDS):
                async with self.hub.open_call(organization, cluster, call, caller=caller) as handle:
                    return await self._collect(handle, organization, cluster)
        except TimeoutError:
            raise self._deadline_error(organization, cluster) from None
        except ApiError as exc:
            raise self._explained(exc, organization, cluster, call.target) from None

    def _explained(
        self, error: ApiError, organization: str, cluster: str, target: pb.Workload
    ) -> ApiError:
        """An agent's NOT_FOUND, with the sidecars the registry has for the workload.

        The agent knows the proxies it can reach; mgmt-api knows the sidecars
        connected to it (the sidecar registry). When the second has the
        workload and the first does not, the agent is what to fix: say so.
        """
        if error.code != Code.NOT_FOUND:
            return error
        found = sidecars.instances(
            self.uow, organization, cluster, target.namespace, target.workload
        )
        if target.instance:
            found = tuple(i for i in found if i == target.instance)
        if not found:
            return error
        shown = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")
        return ApiError(
            Code.NOT_FOUND,
            f"{error.message}; {len(found)} sidecar(s) of service "
            f"{target.workload}.{target.namespace} are connected ({shown}), but the cluster's "
            "agent does not list them: it reaches sidecars with its own mesh certificate "
            "(--workload-token) on their diagnostics port (docs/agent.md, Sidecars)",
            metadata={**error.metadata, "sidecars": str(len(found))},
            field=error.field,
        )

    async def _collect(self, handle: Replies, organization: str, cluster: str) -> dict[str, Any]:
        parts: dict[str, bytearray] = {}
        results: list[InstanceResult] = []
        size = 0
        while True:
            reply = await handle.next()
            kind = reply.WhichOneof("kind")
            if kind == "chunk":
                size += len(reply.chunk.data)
                if size > MAX_RESPONSE_BYTES:
                    raise ApiError(
                        Code.RESOURCE_EXHAUSTED,
                        f"the answer is larger than {MAX_RESPONSE_BYTES} bytes; narrow it "
                        "(resource, mask, filter, one instance)",
                        metadata={"cluster": fqnmod.cluster_fqn(organization, cluster)},
                    )
                parts.setdefault(reply.chunk.instance, bytearray()).extend(reply.chunk.data)
            elif kind == "instance_done":
                done = reply.instance_done
                body = parts.pop(done.workload.instance, bytearray())
                if done.status.code != OK:
                    results.append(InstanceResult(done.workload, error=done.status))
                    continue
                try:
                    payload = json.loads(body)
                except ValueError:
                    status = pb.Status(code=int(Code.INTERNAL), message="the agent sent bad JSON")
                    results.append(InstanceResult(done.workload, error=status))
                    continue
                results.append(InstanceResult(done.workload, payload=payload))
            elif kind == "done":
                if reply.done.code != OK:
                    raise api_error(reply.done, cluster=fqnmod.cluster_fqn(organization, cluster))
                return assemble(results)

    async def open_logs(
        self, organization: str, cluster: str, call: pb.Call, caller: str = ""
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The log stream as JSON-able lines. Raises (before the first line) when the call
        fails outright: no agent, unknown workload, bad field, no answer in time."""
        context = self.hub.open_call(organization, cluster, call, caller=caller)
        try:
            async with asyncio.timeout(self.timeout_seconds + AGENT_MARGIN_SECONDS):
                handle = await context.__aenter__()
        except TimeoutError:
            raise self._deadline_error(organization, cluster) from None
        try:
            async with asyncio.timeout(self.timeout_seconds + AGENT_MARGIN_SECONDS):
                first = await handle.next()
        except TimeoutError:
            await context.__aexit__(None, None, None)
            raise self._deadline_error(organization, cluster) from None
        kind = first.WhichOneof("kind")
        if kind == "done" and first.done.code != OK:
            await context.__aexit__(None, None, None)
            error = api_error(first.done, cluster=fqnmod.cluster_fqn(organization, cluster))
            raise self._explained(error, organization, cluster, call.target)
        return self._lines(context, handle, first)

    @staticmethod
    async def _lines(
        context: Any, handle: Replies, first: pb.Reply
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Lines until the agent says done; leaving early cancels the agent's tailing."""
        try:
            reply = first
            while True:
                kind = reply.WhichOneof("kind")
                if kind == "log":
                    yield {
                        **workload_view(reply.log.workload),
                        "line": reply.log.line,
                        "time": reply.log.time,
                    }
                elif kind == "instance_done" and reply.instance_done.status.code != OK:
                    yield {
                        **workload_view(reply.instance_done.workload),
                        "error": status_view(reply.instance_done.status),
                    }
                elif kind == "done":
                    if reply.done.code != OK:
                        yield {"error": status_view(reply.done)}
                    return
                reply = await handle.next()
        finally:
            await context.__aexit__(None, None, None)


def levels_request(body: SetLoggerLevelsRequest) -> pb.SetLoggers:
    check_fields(contract.check_loggers, body.level, body.loggers)
    return pb.SetLoggers(level=body.level, loggers=body.loggers)
