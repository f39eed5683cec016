"""The distribution servicer and the subscriber, talking over a real socket.

The snapshot builder here serves from a dict per cluster; the management
plane's store-backed builder is covered by the policy-publishing tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from meshplane.config_source import ConfigError
from meshplane.distribution_client import SnapshotSubscriber, current_dir
from meshplane.distribution_contract import NodeIdentity
from meshplane.proto.distribution.v1 import distribution_pb2 as pb
from meshplane.proto.distribution.v1 import distribution_pb2_grpc as pb_grpc
from mgmt_api.distribution.feed import ChangeFeed
from mgmt_api.distribution.server import DistributionServicer
from mgmt_api.service.enforcement import Snapshot
from mgmt_api.service.instances import SubscriberRegistry
from mgmt_api.service.stream_auth import AuthError
from tests.support.processes import eventually

TOKENS = {"token-east": ("acme", "east"), "token-west": ("acme", "west")}


def _loader(path: Path) -> dict[str, str]:
    files = {p.name: p.read_text() for p in sorted(path.glob("*.yaml"))}
    if any("invalid" in text for text in files.values()):
        raise ConfigError("invalid policy", field="spec")
    return files


class Harness:
    def __init__(self) -> None:
        self.policies: dict[str, dict[str, bytes]] = {"east": {}, "west": {}}
        self.feed = ChangeFeed()
        self.registry = SubscriberRegistry(stale_after=0.0)

    async def build(self, node: NodeIdentity) -> Snapshot:
        return Snapshot(dict(self.policies[node.cluster]))

    async def authenticate(self, token: str, node: NodeIdentity) -> str:
        """The token's grant (its key id in the product; nothing here checks it again)."""
        if TOKENS.get(token) != (node.organization, node.cluster):
            raise AuthError(f"token not valid for {node.organization}/{node.cluster}")
        return f"key-of-{token}"

    def publish(self, cluster: str, **files: str) -> None:
        self.policies[cluster] = {f"{k}.yaml": v.encode() for k, v in files.items()}
        self.feed.notify()


@pytest.fixture
async def harness() -> AsyncIterator[tuple[Harness, int]]:
    h = Harness()
    server = grpc.aio.server()
    servicer = DistributionServicer(h.build, h.authenticate, h.feed, h.registry, heartbeat=0.5)
    # The generated *_pb2_grpc module has no annotations (protoc's grpc plugin writes none).
    pb_grpc.add_PolicyDistributionServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield h, port
    await server.stop(0)


def _subscriber(port: int, tmp: Path, cluster: str, token: str) -> SnapshotSubscriber:
    return SnapshotSubscriber(
        f"127.0.0.1:{port}",
        NodeIdentity("ratelimit", "acme", cluster, f"{cluster}-pod"),
        _loader,
        tmp,
        credentials=lambda: token,
        max_backoff=0.2,
    )


async def test_changes_reach_the_subscriber_and_the_ack_is_visible(
    harness: tuple[Harness, int], tmp_path: Path
) -> None:
    h, port = harness
    h.publish("east", limits="requests: 3")
    sub = _subscriber(port, tmp_path, "east", "token-east")
    task = asyncio.create_task(sub.run())
    try:
        await eventually(lambda: _loader(current_dir(tmp_path)) == {"limits.yaml": "requests: 3"})
        h.publish("east", limits="requests: 5")
        await eventually(lambda: _loader(current_dir(tmp_path)) == {"limits.yaml": "requests: 5"})
        await eventually(lambda: h.registry.for_cluster("acme", "east")[0].last_result == "ACK")
        (status,) = h.registry.for_cluster("acme", "east")
        assert status.applied_version == sub.applied_version == status.sent_version
        assert status.connected
    finally:
        task.cancel()
    await eventually(lambda: not h.registry.for_cluster("acme", "east")[0].connected)
    view = h.registry.for_cluster("acme", "east")[0].to_json(now=1e12, stale_after=60)
    assert view["stale"] is True


async def test_a_nacked_snapshot_is_visible_and_the_old_policy_stays(
    harness: tuple[Harness, int], tmp_path: Path
) -> None:
    h, port = harness
    h.publish("east", limits="good")
    sub = _subscriber(port, tmp_path, "east", "token-east")
    task = asyncio.create_task(sub.run())
    try:
        await eventually(lambda: sub.applied_version != "")
        good = sub.applied_version
        h.publish("east", limits="invalid")
        await eventually(lambda: h.registry.for_cluster("acme", "east")[0].last_result == "NACK")
        status = h.registry.for_cluster("acme", "east")[0]
        assert status.applied_version == good
        assert status.nacked_version == status.sent_version != good
        assert "invalid policy" in status.last_error
        assert _loader(current_dir(tmp_path)) == {"limits.yaml": "good"}
    finally:
        task.cancel()


async def test_a_subscriber_never_receives_another_clusters_policy(
    harness: tuple[Harness, int],
) -> None:
    h, port = harness
    h.publish("west", secret="west-only")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.PolicyDistributionStub(channel)  # type: ignore[no-untyped-call]

        async def ask_for_west() -> AsyncIterator[pb.SnapshotRequest]:
            yield pb.SnapshotRequest(
                node=pb.Node(kind="ratelimit", organization="acme", cluster="west")
            )
            await asyncio.sleep(5)

        call = stub.StreamSnapshots(
            ask_for_west(), metadata=[("authorization", "Bearer token-east")]
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in call:
                pytest.fail("a snapshot was sent to the wrong cluster")
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_a_stream_without_credentials_is_unauthenticated(
    harness: tuple[Harness, int],
) -> None:
    _, port = harness
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.PolicyDistributionStub(channel)  # type: ignore[no-untyped-call]

        async def hello() -> AsyncIterator[pb.SnapshotRequest]:
            yield pb.SnapshotRequest(
                node=pb.Node(kind="extauthz", organization="acme", cluster="east")
            )
            await asyncio.sleep(5)

        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in stub.StreamSnapshots(hello()):
                pass
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
