"""Is an instance still there? Keep-alives, staleness, pruning, revoked streams.

The status answers "has my change reached the proxies?"; an instance that
vanished without closing its stream must not keep answering "yes". These
tests run the real servicer and the real subscriber over a socket with short
intervals, plus the registry's rules on a fake clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from meshplane.distribution_client import SnapshotSubscriber
from meshplane.distribution_contract import NodeIdentity
from meshplane.proto.distribution.v1 import distribution_pb2 as pb
from meshplane.proto.distribution.v1 import distribution_pb2_grpc as pb_grpc
from mgmt_api.distribution.feed import ChangeFeed
from mgmt_api.distribution.server import DistributionServicer
from mgmt_api.service.enforcement import Snapshot
from mgmt_api.service.instances import SubscriberRegistry
from mgmt_api.service.stream_auth import AuthError, Revocation
from tests.support.processes import eventually

NODE = NodeIdentity("extauthz", "acme", "east", "pod-1")


def _loader(path: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(path.glob("*.yaml"))}


# ---- the registry's rules ---------------------------------------------------


def test_stale_means_not_heard_from_whether_or_not_connected() -> None:
    registry = SubscriberRegistry(stale_after=60)
    registry.connected(NODE, "v1", now=1000)
    (row,) = registry.for_cluster("acme", "east")
    assert row.connected
    assert row.to_json(now=1059, stale_after=60)["stale"] is False
    # Still "connected" (a half-open stream), but silent for longer than 60 s.
    assert row.to_json(now=1061, stale_after=60)["stale"] is True
    registry.heartbeat(NODE, now=1061)
    (row,) = registry.for_cluster("acme", "east")
    assert row.to_json(now=1100, stale_after=60)["stale"] is False


def test_a_keepalive_keeps_the_nack_visible() -> None:
    registry = SubscriberRegistry()
    registry.connected(NODE, "v1", now=1)
    registry.nacked(NODE, "v1", "v2", "bad key", now=2)
    registry.heartbeat(NODE, now=3)
    (row,) = registry.for_cluster("acme", "east")
    assert (row.last_result, row.nacked_version, row.last_error) == ("NACK", "v2", "bad key")
    assert row.last_contact == 3


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        # sent v2 at 10, ACKed at 10.3: one observation of 0.3 s (bucket le=0.5).
        ([("sent", "v2", 10.0), ("ack", "v2", 10.3)], {"0.25": 0, "0.5": 1, "+Inf": 1}),
        # An ACK of an older version than the one sent is not this send's answer.
        ([("sent", "v2", 10.0), ("ack", "v1", 11.0)], {"+Inf": 0}),
        # A NACK ends the wait: a later ACK of the same version is not timed from the send.
        ([("sent", "v2", 10.0), ("nack", "v2", 11.0), ("ack", "v2", 12.0)], {"+Inf": 0}),
        # A second ACK of the same version is not observed twice.
        ([("sent", "v2", 10.0), ("ack", "v2", 12.0), ("ack", "v2", 13.0)], {"2.5": 1, "+Inf": 1}),
        # Slower than the last bound: counted only in +Inf.
        ([("sent", "v2", 0.0), ("ack", "v2", 400.0)], {"300": 0, "+Inf": 1}),
    ],
)
def test_propagation_is_the_time_from_send_to_the_ack_of_that_version(
    events: list[tuple[str, str, float]], expected: dict[str, int]
) -> None:
    registry = SubscriberRegistry()
    registry.connected(NODE, "v1", now=0)
    for event, version, now in events:
        if event == "sent":
            registry.sent(NODE, version, now)
        elif event == "ack":
            registry.acked(NODE, version, now)
        else:
            registry.nacked(NODE, "v1", version, "refused", now)
    histogram = registry.propagation().get("extauthz")
    cumulative = dict(histogram.cumulative()) if histogram else {"+Inf": 0}
    assert {le: cumulative[le] for le in expected} == expected


def test_rows_gone_for_long_are_pruned_and_a_deleted_cluster_forgotten() -> None:
    registry = SubscriberRegistry(stale_after=60)
    assert registry.forget_after_seconds == 600  # ten stale periods, at least 10 min
    old = NodeIdentity("extauthz", "acme", "east", "host-1")  # a restarted process's old row
    registry.connected(old, "v1", now=0)
    registry.disconnected(old, now=10)
    registry.connected(NODE, "v1", now=500)
    assert len(registry.for_cluster("acme", "east", now=600)) == 2
    assert [r.node.instance for r in registry.for_cluster("acme", "east", now=611)] == ["pod-1"]
    registry.forget_cluster("acme", "east")
    assert registry.for_cluster("acme", "east") == []


def test_the_old_streams_late_disconnect_does_not_hide_the_new_stream() -> None:
    """A reconnect can beat the server noticing that the old stream died."""
    registry = SubscriberRegistry()
    first = registry.connected(NODE, "v1", now=1)
    second = registry.connected(NODE, "v1", now=2)
    registry.disconnected(NODE, now=3, stream=first)
    (row,) = registry.for_cluster("acme", "east")
    assert row.connected
    registry.disconnected(NODE, now=4, stream=second)
    (row,) = registry.for_cluster("acme", "east")
    assert not row.connected


# ---- over a socket ----------------------------------------------------------


class Plane:
    def __init__(self) -> None:
        self.feed = ChangeFeed()
        self.registry = SubscriberRegistry()
        self.revoked: Revocation | None = None

    async def build(self, node: NodeIdentity) -> Snapshot:
        return Snapshot({"extauthz.yaml": b"defaultPolicy: deny\n"})

    async def authenticate(self, token: str, node: NodeIdentity) -> str:
        if token != "token":
            raise AuthError("bad token")
        return "key-1"

    async def still_admitted(self, grant: str, node: NodeIdentity) -> Revocation | None:
        assert grant == "key-1"
        return self.revoked


@pytest.fixture
async def plane() -> AsyncIterator[tuple[Plane, int]]:
    p = Plane()
    server = grpc.aio.server()
    servicer = DistributionServicer(
        p.build, p.authenticate, p.feed, p.registry, heartbeat=0.2, still_admitted=p.still_admitted
    )
    pb_grpc.add_PolicyDistributionServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield p, port
    await server.stop(0)


def _subscriber(port: int, tmp: Path, heartbeat: float) -> SnapshotSubscriber:
    return SnapshotSubscriber(
        f"127.0.0.1:{port}",
        NODE,
        _loader,
        tmp,
        credentials=lambda: "token",
        heartbeat=heartbeat,
        max_backoff=0.2,
    )


async def test_keepalives_advance_last_contact_between_snapshots(
    plane: tuple[Plane, int], tmp_path: Path
) -> None:
    p, port = plane
    task = asyncio.create_task(_subscriber(port, tmp_path, heartbeat=0.1).run())
    try:
        await eventually(lambda: p.registry.for_cluster("acme", "east")[:1] != [])
        await eventually(lambda: p.registry.for_cluster("acme", "east")[0].last_result == "ACK")
        acked_at = p.registry.for_cluster("acme", "east")[0].last_contact
        # No new snapshot is sent (nothing changes), yet contact moves on.
        await eventually(
            lambda: p.registry.for_cluster("acme", "east")[0].last_contact > acked_at + 0.3
        )
        (row,) = p.registry.for_cluster("acme", "east")
        assert row.last_result == "ACK" and row.connected
    finally:
        task.cancel()


async def test_a_silent_subscriber_turns_stale_while_its_stream_is_open(
    plane: tuple[Plane, int], tmp_path: Path
) -> None:
    """Keep-alives every 60 s against a 0.5 s threshold: connected, yet stale."""
    p, port = plane
    p.registry.stale_after = 0.5
    task = asyncio.create_task(_subscriber(port, tmp_path, heartbeat=60).run())
    try:
        await eventually(lambda: p.registry.for_cluster("acme", "east")[:1] != [])
        await eventually(lambda: p.registry.for_cluster("acme", "east")[0].last_result == "ACK")
        await asyncio.sleep(0.7)
        (row,) = p.registry.for_cluster("acme", "east")
        assert row.connected
        assert row.to_json(time.time(), p.registry.stale_after)["stale"] is True
    finally:
        task.cancel()


async def test_a_revoked_grant_ends_the_open_stream(
    plane: tuple[Plane, int], tmp_path: Path
) -> None:
    p, port = plane
    sub = _subscriber(port, tmp_path, heartbeat=60)
    run = asyncio.create_task(sub.run_once())
    await eventually(lambda: sub.applied_version != "")
    p.revoked = Revocation("the stream's key was revoked")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async with asyncio.timeout(5):
            await run
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "revoked" in (info.value.details() or "")
    (row,) = p.registry.for_cluster("acme", "east")
    assert not row.connected


async def test_a_deleted_cluster_ends_its_streams_and_forgets_them(
    plane: tuple[Plane, int], tmp_path: Path
) -> None:
    p, port = plane
    sub = _subscriber(port, tmp_path, heartbeat=60)
    run = asyncio.create_task(sub.run_once())
    await eventually(lambda: sub.applied_version != "")
    p.revoked = Revocation("the cluster was deleted", cluster_gone=True)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async with asyncio.timeout(5):
            await run
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert p.registry.for_cluster("acme", "east") == []


async def test_a_stream_the_server_no_longer_admits_at_open_is_refused(
    plane: tuple[Plane, int],
) -> None:
    p, port = plane
    p.revoked = Revocation("the stream's key was revoked")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.PolicyDistributionStub(channel)  # type: ignore[no-untyped-call]

        async def hello() -> AsyncIterator[pb.SnapshotRequest]:
            yield pb.SnapshotRequest(node=NODE.to_proto())
            await asyncio.sleep(5)

        call = stub.StreamSnapshots(hello(), metadata=[("authorization", "Bearer token")])
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in call:
                pytest.fail("a snapshot was sent on a revoked grant")
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
