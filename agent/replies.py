"""The one way a diagnostics answer leaves the agent: redacted, encoded, chunked.

Every ``Reply`` the tunnel sends for a call is built here, and every piece of
content in it passes :mod:`agent.redact` on the way: JSON answers (config
dumps, server info, stats, clusters, logger levels) through
:func:`~agent.redact.redact` before they are encoded, log lines and status
messages (which may quote a proxy's answer) through
:func:`~agent.redact.redact_text`. The service layer (:mod:`agent.diagnostics`)
gets a :class:`Replies` and never the raw stream, so no endpoint has to
remember to redact, and a new one cannot forget.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from agent.contract import StatusCode
from agent.redact import redact, redact_text
from meshplane.proto.tunnel.v1 import tunnel_pb2 as pb

CHUNK_BYTES = 256 * 1024

Put = Callable[[pb.Reply], Awaitable[None]]


def _encode(payload: dict[str, Any], count_as: str) -> bytes:
    """Redacted JSON; in a worker thread, since a config dump can take seconds."""
    clean, count = redact(payload)
    if count_as:
        clean[count_as] = count
    return json.dumps(clean, separators=(",", ":")).encode()


def _status(code: StatusCode, message: str = "", field: str = "") -> pb.Status:
    return pb.Status(code=int(code), message=redact_text(message)[0], field=field)


def done_reply(call_id: int, code: StatusCode, message: str = "", field: str = "") -> pb.Reply:
    """The last reply of a call (for the tunnel's own refusals, sent without a queue wait)."""
    return pb.Reply(id=call_id, done=_status(code, message, field))


class Replies:
    """The replies of one call, redacted on their way to ``put``."""

    def __init__(self, call_id: int, put: Put) -> None:
        self.call_id = call_id
        self._put = put

    async def answer(
        self, workload: pb.Workload, payload: dict[str, Any], *, count_as: str = ""
    ) -> None:
        """One instance's JSON answer (redacted; with ``count_as`` naming the field that
        reports how many values were), in chunks, then its ``instance_done``."""
        body = await asyncio.to_thread(_encode, payload, count_as)
        for start in range(0, len(body), CHUNK_BYTES):
            chunk = pb.Chunk(instance=workload.instance, data=body[start : start + CHUNK_BYTES])
            await self._put(pb.Reply(id=self.call_id, chunk=chunk))
        await self.instance_done(workload, StatusCode.OK)

    async def instance_done(
        self, workload: pb.Workload, code: StatusCode, message: str = "", field: str = ""
    ) -> None:
        done = pb.InstanceDone(workload=workload, status=_status(code, message, field))
        await self._put(pb.Reply(id=self.call_id, instance_done=done))

    async def started(self, workloads: list[pb.Workload]) -> None:
        await self._put(pb.Reply(id=self.call_id, started=pb.Started(workloads=workloads)))

    async def log(self, workload: pb.Workload, line: str, time: str) -> None:
        clean = redact_text(line)[0]
        await self._put(
            pb.Reply(id=self.call_id, log=pb.LogLine(workload=workload, line=clean, time=time))
        )

    async def done(self, code: StatusCode, message: str = "", field: str = "") -> None:
        await self._put(done_reply(self.call_id, code, message, field))
