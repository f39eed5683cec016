"""The one path diagnostics answers leave the agent by (agent.replies): each kind of
reply comes out redacted, and no other module of the agent builds a reply."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import agent
from agent.contract import StatusCode
from agent.redact import REDACTED
from agent.replies import CHUNK_BYTES, Replies
from meshplane.proto.tunnel.v1 import tunnel_pb2 as pb

WORKLOAD = pb.Workload(namespace="shop", workload="web", instance="web-1")


def _replies() -> tuple[Replies, list[pb.Reply]]:
    sent: list[pb.Reply] = []

    async def put(reply: pb.Reply) -> None:
        sent.append(reply)

    return Replies(7, put), sent


async def test_an_answer_is_redacted_then_chunked() -> None:
    replies, sent = _replies()
    filler = ["x" * 1000] * 600  # over two chunks
    payload: dict[str, Any] = {
        "serverInfo": {"node": {"metadata": {"db_password": "p", "keep": "k"}}},
        "f": filler,
    }
    await replies.answer(WORKLOAD, payload, count_as="redactedFields")
    *chunks, last = sent
    assert len(chunks) == 3 and all(len(c.chunk.data) <= CHUNK_BYTES for c in chunks)
    assert last.instance_done.status.code == StatusCode.OK and last.id == 7
    body = json.loads(b"".join(c.chunk.data for c in chunks))
    assert body["serverInfo"]["node"]["metadata"] == {"db_password": REDACTED, "keep": "k"}
    assert body["redactedFields"] == 1
    assert payload["serverInfo"]["node"]["metadata"]["db_password"] == "p"  # input untouched


async def test_log_lines_and_status_messages_are_redacted() -> None:
    replies, sent = _replies()
    await replies.log(WORKLOAD, "'authorization', 'Bearer abc'", "2026-01-01T00:00:00Z")
    await replies.instance_done(WORKLOAD, StatusCode.INTERNAL, "answered 500: token=abc")
    await replies.done(StatusCode.INVALID_ARGUMENT, "filter: password=hunter2", "filter")
    assert sent[0].log.line == f"'authorization', '{REDACTED}'"
    assert sent[1].instance_done.status.message == f"answered 500: token={REDACTED}"
    assert sent[2].done.message == f"filter: password={REDACTED}"
    assert sent[2].done.field == "filter"


def test_no_other_module_builds_a_reply() -> None:
    """So a new operation cannot send an answer that skipped redaction."""
    root = Path(agent.__file__).parent
    builders = {
        path.relative_to(root).as_posix()
        for path in root.rglob("*.py")
        if re.search(r"\b(pb\.)?(Reply|Chunk|LogLine|InstanceDone)\(", path.read_text())
    }
    assert builders == {"replies.py"}
