"""One diagnostics call, from the tunnel's ``Call`` to its ``Reply`` messages.

The service layer of the agent: it checks the call's fields
(:mod:`agent.contract`), resolves the workload to proxies through the
``ProxySource``, builds the allow-listed admin requests (:mod:`agent.admin`),
sends them to every selected instance at once, shapes the answers, and
hands them to :class:`agent.replies.Replies`, the one path out, which
redacts and chunks them:

- per instance, the JSON answer as ``chunk`` messages then ``instance_done``
  (or ``instance_done`` with the instance's error), so one hung proxy does
  not hide the others' answers;
- log lines as ``log`` messages, interleaved across instances;
- finally ``done``: OK, or the error of the whole call (bad field, unknown
  workload).

Per instance payloads (merged into the REST records by mgmt-api):
``{"clusterStats"}``, ``{"stats"}`` (plus ``"serverInfo"`` when asked), ``{"configDump",
"redactedFields"}``, ``{"levels"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agent import admin, contract
from agent.contract import FieldError, StatusCode
from agent.discovery import LogEntry, LogRequest, LogsUnavailable, Proxy, ProxySource, select
from agent.envoy_admin import AdminCallError, AdminClient
from agent.logtail import rfc3339
from agent.replies import Replies
from meshplane.proto.tunnel.v1 import tunnel_pb2 as pb

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_SECONDS = 10.0


class CallFailed(Exception):
    """The whole call fails with this status."""

    def __init__(self, code: StatusCode, message: str, field: str = "") -> None:
        super().__init__(message)
        self.code, self.message, self.field = code, message, field


def _json(body: bytes, proxy: Proxy, path: str) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        raise AdminCallError(
            StatusCode.INTERNAL, f"proxy {proxy.name} answered {path} with something not JSON"
        ) from None


class Diagnostics:
    def __init__(self, source: ProxySource, admin_client: AdminClient) -> None:
        self.source = source
        self.admin = admin_client

    async def run(self, call: pb.Call, replies: Replies) -> None:
        """Answer ``call`` through ``replies``; always ends with a ``done`` reply
        (unless cancelled: the management plane gave up on it)."""
        try:
            await self._run(call, replies)
        except CallFailed as exc:
            await replies.done(exc.code, exc.message, exc.field)
            return
        except FieldError as exc:
            await replies.done(StatusCode.INVALID_ARGUMENT, str(exc), exc.field)
            return
        await replies.done(StatusCode.OK)

    async def _run(self, call: pb.Call, replies: Replies) -> None:
        target = call.target
        contract.check_workload(target.namespace, target.workload, target.instance)
        operation = call.WhichOneof("operation")
        within = (call.timeout_ms / 1000.0) if call.timeout_ms else DEFAULT_TIMEOUT_SECONDS
        fetch = self._fetcher(call, operation, within)  # checks the fields first
        proxies = select(
            await self.source.proxies(), target.namespace, target.workload, target.instance
        )
        if not proxies:
            what = f"{target.namespace}/{target.workload}"
            if target.instance:
                what += f" instance {target.instance}"
            raise CallFailed(StatusCode.NOT_FOUND, f"no proxy of workload {what} is known")
        if operation == "stream_logs":
            await self._stream_logs(call, proxies, replies)
            return
        assert fetch is not None
        await asyncio.gather(*(self._one(p, fetch, replies) for p in proxies))

    def _fetcher(self, call: pb.Call, operation: str | None, within: float) -> _Unary | None:
        """The per-proxy work of a unary operation (its fields checked now)."""
        if operation == "cluster_stats":
            request = admin.cluster_stats()

            async def cluster_stats(proxy: Proxy) -> dict[str, Any]:
                return {"clusterStats": await self._get_json(proxy, request, within)}

            return _Unary(cluster_stats)
        if operation == "server_stats":
            op = call.server_stats
            stats_request = admin.server_stats(op.filter, op.used_only)
            info_request = admin.server_info() if op.include_server_info else None

            async def server_stats(proxy: Proxy) -> dict[str, Any]:
                stats_call = self._get_json(proxy, stats_request, within, field="filter")
                if info_request is None:
                    return {"stats": (await stats_call).get("stats", [])}
                info, stats = await asyncio.gather(
                    self._get_json(proxy, info_request, within), stats_call
                )
                return {"serverInfo": info, "stats": stats.get("stats", [])}

            return _Unary(server_stats)
        if operation == "config_dump":
            cd = call.config_dump
            dump_request = admin.config_dump(cd.resource, cd.mask, cd.include_eds)
            field = "resource" if cd.resource else "mask"

            async def config_dump(proxy: Proxy) -> dict[str, Any]:
                return {"configDump": await self._get_json(proxy, dump_request, within, field)}

            return _Unary(config_dump, count_as="redactedFields")
        if operation in ("get_loggers", "set_loggers"):
            if operation == "get_loggers":
                log_request = admin.get_loggers()
                field = ""
            else:
                sl = call.set_loggers
                log_request = admin.set_loggers(sl.level, dict(sl.loggers))
                field = "level" if sl.level else "loggers"

            async def loggers(proxy: Proxy) -> dict[str, Any]:
                answer = await self.admin.call(proxy, log_request, within)
                text = answer.body.decode("utf-8", errors="replace")
                if answer.status != 200:
                    raise _refused(proxy, "/logging", answer.status, text, field)
                return {"levels": admin.parse_loggers(text)}

            return _Unary(loggers)
        if operation == "stream_logs":
            contract.check_stream(
                call.stream_logs.tail_lines if call.stream_logs.HasField("tail_lines") else None,
                call.stream_logs.since_seconds
                if call.stream_logs.HasField("since_seconds")
                else None,
            )
            return None
        raise CallFailed(
            StatusCode.INVALID_ARGUMENT, "the call names no operation this agent knows"
        )

    async def _get_json(
        self, proxy: Proxy, request: admin.AdminRequest, within: float, field: str = ""
    ) -> Any:
        answer = await self.admin.call(proxy, request, within)
        if answer.status != 200:
            text = answer.body.decode("utf-8", errors="replace")
            raise _refused(proxy, request.path, answer.status, text, field)
        return _json(answer.body, proxy, request.path)

    async def _one(self, proxy: Proxy, unary: _Unary, replies: Replies) -> None:
        workload = _workload(proxy)
        try:
            payload = await unary.fetch(proxy)
        except AdminCallError as exc:
            await replies.instance_done(workload, exc.code, exc.message)
            return
        except _Refused as exc:
            await replies.instance_done(workload, exc.code, exc.message, exc.field)
            return
        await replies.answer(workload, payload, count_as=unary.count_as)

    async def _stream_logs(self, call: pb.Call, proxies: list[Proxy], replies: Replies) -> None:
        op = call.stream_logs
        request = LogRequest(
            follow=op.follow,
            tail_lines=op.tail_lines if op.HasField("tail_lines") else None,
            since_seconds=op.since_seconds if op.HasField("since_seconds") else None,
        )

        await replies.started([_workload(p) for p in proxies])

        async def one(proxy: Proxy) -> None:
            workload = _workload(proxy)
            lines: AsyncIterator[LogEntry] = self.source.logs(proxy, request)
            try:
                async for entry in lines:
                    stamp = rfc3339(entry.time if entry.time is not None else time.time())
                    await replies.log(workload, entry.line, stamp)
                code, message = StatusCode.OK, ""
            except LogsUnavailable as exc:
                code, message = StatusCode.FAILED_PRECONDITION, str(exc)
            except AdminCallError as exc:
                code, message = exc.code, exc.message
            finally:
                with contextlib.suppress(Exception):
                    await lines.aclose()  # type: ignore[attr-defined]
            await replies.instance_done(workload, code, message)

        await asyncio.gather(*(one(p) for p in proxies))


@dataclass(frozen=True)
class _Unary:
    """The per-proxy work of a unary operation, and the field (if any) that reports
    how many values redaction replaced in its answer."""

    fetch: Callable[[Proxy], Awaitable[dict[str, Any]]]
    count_as: str = ""


def _workload(proxy: Proxy) -> pb.Workload:
    return pb.Workload(namespace=proxy.namespace, workload=proxy.workload, instance=proxy.instance)


class _Refused(Exception):
    def __init__(self, code: StatusCode, message: str, field: str) -> None:
        super().__init__(message)
        self.code, self.message, self.field = code, message, field


def _refused(proxy: Proxy, path: str, status_code: int, text: str, field: str) -> _Refused:
    """An admin answer other than 200: a 400 is the caller's field (Envoy names why)."""
    reason = " ".join(text.split())[:300]
    if 400 <= status_code < 500 and field:
        return _Refused(StatusCode.INVALID_ARGUMENT, f"{field}: {reason}", field)
    return _Refused(
        StatusCode.INTERNAL, f"proxy {proxy.name} answered {path} with {status_code}: {reason}", ""
    )
