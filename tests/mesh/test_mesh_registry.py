"""The mesh's endpoint registry and the sidecar builds, over a real SQLite store (no process).

- the registry: a sidecar's row goes when its own stream ends, not when its
  replica stops; a reconnect owns the row, so the old stream's late leave
  does not drop it; rows unheard for a stale period are swept, but not by a
  replica that has not run for one itself (it just came back from an outage);
- the builds: nothing is rebuilt while the cluster's input and trust bundle
  are what a stream was last sent; what sidecars share is serialized once,
  and a join re-serializes only the joined service's cluster.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshplane.sidecar_contract import SidecarNode
from mgmt_api.compiler import gateway_xds, sidecar_xds
from mgmt_api.compiler.sidecar_xds import SidecarEndpoint, SidecarInput
from mgmt_api.distribution.feed import ChangeFeed
from mgmt_api.distribution.sidecar_ads import SidecarStreams
from mgmt_api.service.instances import SubscriberRegistry
from mgmt_api.service.sidecars import SidecarDirectory
from mgmt_api.service.workload_trust import Attestation, WorkloadTrustStore
from mgmt_api.store.engine import create_engine, migrate
from mgmt_api.store.uow import UnitOfWork

NOW = 1_800_000_000.0
STALE = 90.0


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def uow(tmp_path: Path) -> Iterator[UnitOfWork]:
    engine = create_engine(f"sqlite+pysqlite:///{tmp_path / 'mgmt-api.db'}")
    migrate(engine)
    try:
        yield UnitOfWork(engine)
    finally:
        engine.dispose()


def node(name: str, service: str = "web", port: int = 15006, ns: str = "shop") -> SidecarNode:
    return SidecarNode("o", "c", f"{name}.{ns}", ns, service, service, 8080, "10.0.0.1", port)


def endpoint(service: str, port: int, ns: str = "shop") -> SidecarEndpoint:
    return SidecarEndpoint(ns, service, "10.0.0.1", port, service)


def test_a_stream_that_ends_leaves_and_one_that_its_replica_drops_stays(
    uow: UnitOfWork,
) -> None:
    a, b = SidecarDirectory(uow, replica="a"), SidecarDirectory(uow, replica="b")
    web = a.join(node("web-1"), "shop/web-1/u1")
    api = a.join(node("api-1", "api", 15007), "shop/api-1/u2")
    # Replica b serves what a's streams registered: the registry is shared.
    assert b.endpoints("o", "c") == (endpoint("api", 15007), endpoint("web", 15006))
    a.leave(web)  # its client hung up
    assert b.endpoints("o", "c") == (endpoint("api", 15007),)
    a.closing()  # SIGTERM: a's streams are cancelled, their sidecars reconnect elsewhere
    a.leave(api)
    assert b.endpoints("o", "c") == (endpoint("api", 15007),)
    # A restarted replica serves the registry at once.
    assert SidecarDirectory(uow, replica="a2").endpoints("o", "c") == (endpoint("api", 15007),)


def test_a_reconnect_owns_the_row_and_the_old_streams_leave_is_ignored(uow: UnitOfWork) -> None:
    a, b = SidecarDirectory(uow, replica="a"), SidecarDirectory(uow, replica="b")
    old = a.join(node("web-1"), "shop/web-1/u1")
    b.join(node("web-1"), "shop/web-1/u1")  # the sidecar came back on b first
    a.leave(old)  # then a saw its old stream end
    assert a.endpoints("o", "c") == (endpoint("web", 15006),)


def test_unheard_rows_are_swept_but_not_by_a_replica_back_from_an_outage(
    uow: UnitOfWork,
) -> None:
    clock = Clock()
    dead = SidecarDirectory(uow, replica="dead", clock=clock, stale_after=STALE)
    dead.join(node("web-1"), "shop/web-1/u1")  # then kill -9: nobody refreshes the row
    clock.now += 10 * STALE  # every replica was down for a long time
    back = SidecarDirectory(uow, replica="back", clock=clock, stale_after=STALE)
    back.refresh()
    assert back.endpoints("o", "c") == (endpoint("web", 15006),), "swept at once"
    api = back.join(node("api-1", "api", 15007), "shop/api-1/u2")
    clock.now += STALE / 2
    back.refresh()  # api's stream is open: heard; web's sidecar never came back
    clock.now += STALE / 2 + 1
    back.refresh()
    assert back.endpoints("o", "c") == (endpoint("api", 15007),)
    back.leave(api)
    assert back.endpoints("o", "c") == ()


def _input(*endpoints: SidecarEndpoint) -> SidecarInput:
    return SidecarInput("c", tuple(sorted(endpoints)), trust_domain="c.o.mesh.local")


class Inputs:
    """The cluster's sidecar input, as the store would give it (set by the test)."""

    def __init__(self) -> None:
        self.current = _input(endpoint("web", 15006), endpoint("api", 15007))
        self.reads = 0

    async def build(self, key: tuple[str, str]) -> SidecarInput:
        del key
        self.reads += 1
        return self.current

    async def bundle(self, key: tuple[str, str]) -> tuple[str, ...]:
        del key
        return ("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",)


def test_nothing_is_rebuilt_while_nothing_changed_and_shared_bytes_are_built_once(
    uow: UnitOfWork,
) -> None:
    async def run() -> None:
        inputs, feed = Inputs(), ChangeFeed()
        streams = SidecarStreams(
            inputs.build,
            inputs.bundle,
            SidecarDirectory(uow),
            feed,
            SubscriberRegistry(),
            attestation=Attestation(uow, WorkloadTrustStore(uow)),
        )
        web, api = node("web-1"), node("api-1", "api", 15007)
        first = await streams.compile(web, 0, None)
        other = await streams.compile(api, 0, None)
        assert first is not None and other is not None and streams.assembled == 2
        # The same outbound clusters, as the same bytes, for both sidecars.
        outbound = [e for e in first.resources[gateway_xds.CLUSTER_TYPE] if "outbound/" in e[0]]
        assert len(outbound) == 2
        for shared in outbound:
            assert any(shared[1] is e[1] for e in other.resources[gateway_xds.CLUSTER_TYPE])
        # A heartbeat, another cluster's write: the same input, nothing rebuilt.
        streams.feed.notify()
        again = await streams.compile(web, streams.feed.revision, first)
        assert again is first and streams.assembled == 2
        # A join of a third api instance: only api's cluster is serialized again.
        built = streams.cache.built
        inputs.current = _input(
            endpoint("web", 15006), endpoint("api", 15007), endpoint("api", 15008)
        )
        streams.feed.notify()
        joined = await streams.compile(web, streams.feed.revision, first)
        assert joined is not None and joined.version != first.version
        assert streams.cache.built == built + 1  # api's cluster; web's listeners are cached
        names = [name for name, _ in joined.resources[gateway_xds.CLUSTER_TYPE]]
        assert sidecar_xds.outbound_cluster_name("shop", "api") in names

    asyncio.run(run())
