"""The policy-stream subscriber: apply, ACK, NACK, cache on disk, reconnect.

The management plane's real distribution server is tested end to end in the
policy-publishing suite; here a scripted in-test server plays its part, so
each client behaviour can be pinned down in isolation.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from meshplane.config_source import ConfigError, FileSource
from meshplane.distribution_client import (
    SnapshotSubscriber,
    current_dir,
    ensure_cache,
)
from meshplane.distribution_contract import NodeIdentity
from meshplane.proto.distribution.v1 import distribution_pb2 as pb
from meshplane.proto.distribution.v1 import distribution_pb2_grpc as pb_grpc

NODE = NodeIdentity("ratelimit", "acme", "east", "pod-1")


def _loader(path: Path) -> dict[str, str]:
    """Toy loader: every file must hold a non-empty value without 'bad'."""
    files = {p.name: p.read_text() for p in sorted(path.glob("*.yaml"))}
    for name, text in files.items():
        if "bad" in text:
            raise ConfigError("bad value", source=name, field="value")
    return files


def _snapshot(version: str, **files: str) -> pb.Snapshot:
    return pb.Snapshot(
        version_info=version,
        nonce=f"n-{version}",
        kind="ratelimit",
        files=[pb.ConfigFile(name=f"{k}.yaml", content=v.encode()) for k, v in files.items()],
    )


class ScriptedServer(pb_grpc.PolicyDistributionServicer):
    """Sends the scripted snapshots and records every request it gets."""

    def __init__(self, snapshots: list[pb.Snapshot]) -> None:
        self.snapshots = snapshots
        self.requests: list[pb.SnapshotRequest] = []
        self.metadata: list[dict[str, str]] = []
        self.answered = asyncio.Event()

    async def StreamSnapshots(
        self,
        request_iterator: AsyncIterator[pb.SnapshotRequest],
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> AsyncIterator[pb.Snapshot]:
        self.metadata.append(dict(context.invocation_metadata() or ()))  # type: ignore[arg-type]
        self.requests.append(await anext(aiter(request_iterator)))
        for snap in self.snapshots:
            yield snap
            self.requests.append(await anext(aiter(request_iterator)))
        self.answered.set()
        await asyncio.sleep(3600)


def _add_servicer(servicer: ScriptedServer, server: grpc.aio.Server) -> None:
    # The generated *_pb2_grpc module has no annotations (protoc's grpc plugin writes none).
    pb_grpc.add_PolicyDistributionServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]


async def _serve(servicer: ScriptedServer) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    _add_servicer(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def _run_until_answered(servicer: ScriptedServer, subscriber: SnapshotSubscriber) -> None:
    task = asyncio.create_task(subscriber.run())
    try:
        async with asyncio.timeout(10):
            await servicer.answered.wait()
    finally:
        task.cancel()


async def test_snapshots_are_applied_acked_and_left_on_disk(tmp_path: Path) -> None:
    servicer = ScriptedServer([_snapshot("v1", a="one"), _snapshot("v2", a="two", b="x")])
    server, port = await _serve(servicer)
    applied: list[str] = []
    sub = SnapshotSubscriber(
        f"127.0.0.1:{port}",
        NODE,
        _loader,
        tmp_path,
        credentials=lambda: "sa-token",
        on_applied=applied.append,
    )
    await _run_until_answered(servicer, sub)
    await server.stop(0)

    first, *answers = servicer.requests
    assert first.node.cluster == "east" and first.node.kind == "ratelimit"
    assert [(a.version_info, a.response_nonce, a.HasField("error_detail")) for a in answers] == [
        ("v1", "n-v1", False),
        ("v2", "n-v2", False),
    ]
    assert servicer.metadata[0]["authorization"] == "Bearer sa-token"
    assert applied == ["v1", "v2"]
    assert _loader(current_dir(tmp_path)) == {"a.yaml": "two", "b.yaml": "x"}


async def test_an_invalid_snapshot_is_nacked_and_the_last_good_one_stays(
    tmp_path: Path,
) -> None:
    servicer = ScriptedServer([_snapshot("v1", a="good"), _snapshot("v2", a="bad")])
    server, port = await _serve(servicer)
    sub = SnapshotSubscriber(f"127.0.0.1:{port}", NODE, _loader, tmp_path)
    await _run_until_answered(servicer, sub)
    await server.stop(0)

    nack = servicer.requests[-1]
    assert nack.response_nonce == "n-v2"
    assert nack.version_info == "v1"
    assert "bad value" in nack.error_detail.message
    assert _loader(current_dir(tmp_path)) == {"a.yaml": "good"}
    assert sub.applied_version == "v1"


async def test_a_restart_resumes_from_the_cached_snapshot_and_reports_its_version(
    tmp_path: Path,
) -> None:
    servicer = ScriptedServer([_snapshot("v7", a="seven")])
    server, port = await _serve(servicer)
    await _run_until_answered(
        servicer, SnapshotSubscriber(f"127.0.0.1:{port}", NODE, _loader, tmp_path)
    )
    await server.stop(0)

    # Management plane gone: a new process still has the policy on disk.
    restarted = SnapshotSubscriber("127.0.0.1:1", NODE, _loader, tmp_path)
    assert restarted.applied_version == "v7"
    source = FileSource(current_dir(tmp_path), _loader, name="cached")
    assert source.load_initial() == {"a.yaml": "seven"}


async def test_workers_see_a_new_snapshot_through_their_file_source(tmp_path: Path) -> None:
    source = FileSource(ensure_cache(tmp_path), _loader, name="streamed")
    assert source.load_initial() == {}
    sub = SnapshotSubscriber("127.0.0.1:1", NODE, _loader, tmp_path)
    assert sub.apply(_snapshot("v1", a="one")) is None
    assert await source.reload_if_changed() is True
    assert source.current == {"a.yaml": "one"}


@pytest.mark.parametrize("name", ["../escape.yaml", ".hidden.yaml", "dir/x.yaml", ""])
def test_snapshot_file_names_cannot_escape_the_cache(tmp_path: Path, name: str) -> None:
    sub = SnapshotSubscriber("127.0.0.1:1", NODE, _loader, tmp_path)
    snap = pb.Snapshot(version_info="v", files=[pb.ConfigFile(name=name, content=b"x")])
    error = sub.apply(snap)
    assert error is not None and "plain file name" in error
    assert not (tmp_path / "escape.yaml").exists()


async def test_the_subscriber_reconnects_after_the_server_comes_back(tmp_path: Path) -> None:
    from tests.support.net import free_port

    port = free_port()
    sub = SnapshotSubscriber(f"127.0.0.1:{port}", NODE, _loader, tmp_path, max_backoff=0.3)
    task = asyncio.create_task(sub.run())
    await asyncio.sleep(0.8)  # a few failed attempts against nothing
    servicer = ScriptedServer([_snapshot("v1", a="late")])
    server = grpc.aio.server()
    _add_servicer(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    try:
        async with asyncio.timeout(10):
            await servicer.answered.wait()
    finally:
        task.cancel()
        await server.stop(0)
    assert sub.applied_version == "v1"
