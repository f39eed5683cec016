"""``.../clusters/{cluster}/proxytools/*``: proxy diagnostics through the cluster's agent.

Every endpoint authenticates, checks READ on the cluster (WRITE for ``PUT
loggerlevels``, which is also audited), then sends one call through the
agent's tunnel (:mod:`mgmt_api.service.proxytools`). The checks that need the store run
in a worker thread; waiting for the agent does not hold one.

``POST streamlogs`` answers NDJSON (one :class:`LogLine` a line) over a
chunked response, or Server-Sent Events when the client accepts
``text/event-stream``. The answer starts once the agent has opened the
stream (so a bad request still gets its status code); when the client goes
away, the agent is told to stop tailing.

``POST /internal/v1/tunnelcalls`` is the hop between replicas: another
replica, which has already authenticated, authorized (and audited) the
caller, signs the call with the shared secret for this replica (method, path,
body, a timestamp and a nonce this replica accepts once); this replica sends it through
the agent tunnel it holds and answers the agent's replies as length-prefixed
frames (:mod:`mgmt_api.service.replicas`). Nothing else is served there.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse

from agent import contract
from meshplane.proto.tunnel.v1 import tunnel_pb2 as pb
from mgmt_api.access import Principal
from mgmt_api.domain import rbac
from mgmt_api.domain.replicas import SIGNATURE_HEADER, frame
from mgmt_api.errors import ApiError, Code
from mgmt_api.routes.deps import Name, call_context, services
from mgmt_api.schemas.proxytools import (
    GetClusterStatsRequest,
    GetClusterStatsResponse,
    GetConfigDumpRequest,
    GetConfigDumpResponse,
    GetLoggerLevelsRequest,
    GetServerStatsRequest,
    GetServerStatsResponse,
    LoggerLevelsResponse,
    LogLine,
    SetLoggerLevelsRequest,
    StreamLogsRequest,
    WorkloadSelector,
)
from mgmt_api.service.proxytools import ProxyTools, check_fields, levels_request
from mgmt_api.service.replicas import FORWARD_PATH, MAX_FORWARD_BODY_BYTES

log = logging.getLogger(__name__)
router = APIRouter()
PREFIX = "/v2/organizations/{organization}/clusters/{cluster}/proxytools"
TAGS: list[str | Any] = ["ProxyDiagnostics"]


def _tools(request: Request) -> ProxyTools:
    tools = services(request).proxytools
    if tools is None:
        raise ApiError(
            Code.FAILED_PRECONDITION,
            "proxy diagnostics need the gRPC listener (--grpc-listen), which is off",
        )
    return tools


async def _authorized(
    request: Request, organization: str, cluster: str, permission: str
) -> tuple[ProxyTools, Principal]:
    tools = _tools(request)

    def check() -> Principal:
        principal = call_context(request).principal
        tools.authorize(principal, organization, cluster, permission)
        return principal

    return tools, await run_in_threadpool(check)


async def _read(
    request: Request,
    organization: str,
    cluster: str,
    body: WorkloadSelector,
    fill: Callable[[pb.Call], object],
) -> JSONResponse:
    """One read-only call to the workload's proxies: READ on the cluster, the
    selector from ``body``, the operation set by ``fill``, the agents' answers."""
    tools, principal = await _authorized(request, organization, cluster, rbac.READ)
    call = tools.new_call(body)
    fill(call)
    return JSONResponse(await tools.unary(organization, cluster, call, principal.fqn))


@router.post(
    PREFIX + "/clusterstats",
    response_model=GetClusterStatsResponse,
    operation_id="GetClusterStats",
    tags=TAGS,
    summary="Upstream cluster stats of the workload's proxies (Envoy /clusters)",
)
async def cluster_stats(
    request: Request,
    organization: Name,
    cluster: Name,
    body: Annotated[GetClusterStatsRequest, Body()],
) -> JSONResponse:
    return await _read(
        request, organization, cluster, body, lambda call: call.cluster_stats.SetInParent()
    )


@router.post(
    PREFIX + "/serverstats",
    response_model=GetServerStatsResponse,
    operation_id="GetServerStats",
    tags=TAGS,
    summary="Server info and stats of the workload's proxies (name filter, used only)",
)
async def server_stats(
    request: Request,
    organization: Name,
    cluster: Name,
    body: Annotated[GetServerStatsRequest, Body()],
) -> JSONResponse:
    check_fields(contract.check_filter, body.filter)
    stats = pb.ServerStats(
        filter=body.filter,
        used_only=body.used_only,
        include_server_info=body.include_server_info,
    )
    return await _read(
        request, organization, cluster, body, lambda call: call.server_stats.CopyFrom(stats)
    )


@router.post(
    PREFIX + "/configdump",
    response_model=GetConfigDumpResponse,
    operation_id="GetConfigDump",
    tags=TAGS,
    summary="Config dump of the workload's proxies, secrets redacted",
)
async def config_dump(
    request: Request,
    organization: Name,
    cluster: Name,
    body: Annotated[GetConfigDumpRequest, Body()],
) -> JSONResponse:
    check_fields(contract.check_config_dump, body.resource, body.mask)
    dump = pb.ConfigDump(resource=body.resource, mask=body.mask, include_eds=body.include_eds)
    return await _read(
        request, organization, cluster, body, lambda call: call.config_dump.CopyFrom(dump)
    )


@router.post(
    PREFIX + "/loggerlevels",
    response_model=LoggerLevelsResponse,
    operation_id="GetLoggerLevels",
    tags=TAGS,
    summary="The logger levels of the workload's proxies",
)
async def get_logger_levels(
    request: Request,
    organization: Name,
    cluster: Name,
    body: Annotated[GetLoggerLevelsRequest, Body()],
) -> JSONResponse:
    return await _read(
        request, organization, cluster, body, lambda call: call.get_loggers.SetInParent()
    )


@router.put(
    PREFIX + "/loggerlevels",
    response_model=LoggerLevelsResponse,
    operation_id="SetLoggerLevels",
    tags=TAGS,
    summary="Set every logger (level) or named loggers of the workload's proxies; audited",
)
async def set_logger_levels(
    request: Request,
    organization: Name,
    cluster: Name,
    body: Annotated[SetLoggerLevelsRequest, Body()],
) -> JSONResponse:
    setting = levels_request(body)
    tools, principal = await _authorized(request, organization, cluster, rbac.WRITE)
    call = tools.new_call(body)
    call.set_loggers.CopyFrom(setting)
    outcome: dict[str, str] = {}
    try:
        answer = await tools.unary(organization, cluster, call, principal.fqn)
    except ApiError as exc:
        outcome["error"] = f"{exc.code.name}: {exc.message}"[:500]
        await run_in_threadpool(
            tools.audit_set_levels, principal, organization, cluster, body, outcome
        )
        raise
    for item in answer["instances"]:
        outcome[item["instance"]] = item["error"]["message"][:200] if "error" in item else "OK"
    await run_in_threadpool(tools.audit_set_levels, principal, organization, cluster, body, outcome)
    return JSONResponse(answer)


@router.post(
    PREFIX + "/streamlogs",
    operation_id="StreamLogs",
    response_model=LogLine,
    tags=TAGS,
    summary="Stream the proxies' logs: NDJSON lines (LogLine), or SSE with "
    "Accept: text/event-stream",
    responses={
        200: {
            "description": "One LogLine per line (application/x-ndjson), or SSE data events.",
            "content": {
                "application/x-ndjson": {"schema": {"$ref": "#/components/schemas/LogLine"}},
                "text/event-stream": {"schema": {"type": "string"}},
            },
        }
    },
)
async def stream_logs(
    request: Request,
    organization: Name,
    cluster: Name,
    body: Annotated[StreamLogsRequest, Body()],
) -> StreamingResponse:
    check_fields(contract.check_stream, body.tail_lines, body.since_seconds)
    tools, principal = await _authorized(request, organization, cluster, rbac.READ)
    call = tools.new_call(body)
    options = pb.StreamLogs(follow=body.follow)
    if body.tail_lines is not None:
        options.tail_lines = body.tail_lines
    if body.since_seconds is not None:
        options.since_seconds = body.since_seconds
    call.stream_logs.CopyFrom(options)
    lines = await tools.open_logs(organization, cluster, call, principal.fqn)
    sse = "text/event-stream" in request.headers.get("accept", "")

    async def encode() -> AsyncIterator[bytes]:
        # Closing ``lines`` (also when the client went away and this task is
        # cancelled) cancels the call, so the agent stops tailing.
        async with contextlib.aclosing(lines):
            async for line in lines:
                text = json.dumps(line, separators=(",", ":"))
                yield f"data: {text}\n\n".encode() if sse else (text + "\n").encode()

    return StreamingResponse(
        encode(),
        media_type="text/event-stream" if sse else "application/x-ndjson",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.post(FORWARD_PATH, include_in_schema=False)
async def forwarded_call(request: Request) -> StreamingResponse:
    """A call another replica forwards to the agent tunnel this replica holds."""
    tools = _tools(request)
    if tools.peers is None:
        raise ApiError(Code.NOT_FOUND, "this replica accepts no forwarded calls")
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > MAX_FORWARD_BODY_BYTES:
            break
    signature = request.headers.get(SIGNATURE_HEADER)
    forwarded = tools.peers.admit(signature, request.method, request.url.path, bytes(body))
    organization, cluster = str(forwarded["organization"]), str(forwarded["cluster"])
    call = forwarded["call"]
    assert isinstance(call, pb.Call)
    log.info(
        "serving a forwarded proxytools call",
        extra={"cluster": f"{organization}/{cluster}", "caller": forwarded["caller"]},
    )
    # Never forwarded again: a replica that lost the tunnel answers 503 and the
    # sender tries the next holder.
    context = tools.hub.open_call(organization, cluster, call, forward=False)
    handle = await context.__aenter__()

    async def relay() -> AsyncIterator[bytes]:
        try:
            while True:
                reply = await handle.next()
                yield frame(reply.SerializeToString())
                if reply.WhichOneof("kind") == "done":
                    return
        finally:
            await context.__aexit__(None, None, None)

    return StreamingResponse(relay(), media_type="application/octet-stream")
