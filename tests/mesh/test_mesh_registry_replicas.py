"""Endpoints across replicas and restarts: simulated sidecars over real gRPC, real PostgreSQL.

Two ``mgmt-api serve`` replicas share one PostgreSQL (the revision poll off,
so only ``NOTIFY`` carries changes across); simulated sidecar Envoys
(:mod:`tests.support.ads_sim`: they subscribe and ACK as Envoy does, with
their pods' workload tokens) stream from either. A sidecar on A gets the
endpoints of sidecars on B and the other way round; a sidecar that hangs up
leaves both replicas' views promptly; a replica killed with -9 or stopped
with SIGTERM takes no endpoint away, and when it comes back, the first
configuration it sends a reconnecting sidecar already holds every endpoint.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.distribution.test_replicas import database  # noqa: F401 - a fixture
from tests.mgmt_api.harness import MgmtServer, ok, unique
from tests.support.ads_sim import MeshCluster, SimLoop, SimSidecar, sidecar
from tests.support.postgres import PostgresServer
from tests.support.processes import wait_until
from tests.support.workload_tokens import PodRef, TestIssuer

ISSUER = TestIssuer("https://kubernetes.default.svc")
WEB = PodRef("shop", "web-1", "web", services=("web",))
API1 = PodRef("shop", "api-1", "api", services=("api",))
API2 = PodRef("shop", "api-2", "api", services=("api",))
PORTS = {WEB.name: 21001, API1.name: 21002, API2.name: 21003}
WEB_CLUSTER, API_CLUSTER = "outbound/shop/web", "outbound/shop/api"


@pytest.fixture(scope="module")
def replicas(
    database: tuple[PostgresServer, str],  # noqa: F811 - the fixture
) -> Iterator[tuple[MgmtServer, MgmtServer]]:
    mp = pytest.MonkeyPatch()
    mp.setenv("MESHPLANE_REVISION_POLL", "1h")  # only NOTIFY crosses the replicas
    started: list[MgmtServer] = []
    try:
        for _ in range(2):
            started.append(MgmtServer(database_url=database[1]).start())
        yield started[0], started[1]
    finally:
        for server in started:
            server.close()
        mp.undo()


@pytest.fixture(scope="module")
def mesh(replicas: tuple[MgmtServer, MgmtServer]) -> Iterator[tuple[MeshCluster, SimLoop]]:
    a, _ = replicas
    with a.admin() as admin:
        org = unique("org")
        ok(admin.post("/v2/organizations", json={"name": org, "organization": {}}))
        cluster = MeshCluster(a, admin, org, "c1")
    cluster.report(ISSUER, [WEB, API1, API2])
    loop = SimLoop()
    yield cluster, loop
    loop.close()


def _sim(cluster: MeshCluster, pod: PodRef) -> SimSidecar:
    return sidecar(cluster.org, cluster.name, pod, PORTS[pod.name], ISSUER)


def _sees(sim: SimSidecar, cluster: str, ports: list[int], timeout: float = 30) -> float:
    """Wait until ``sim``'s last clusters carry exactly ``ports`` for ``cluster``; seconds."""
    start = time.monotonic()
    wait_until(
        lambda: not sim.error and sim.endpoints.get(cluster) == ports,
        timeout,
        f"{sim.node.instance} to see {cluster} at {ports} (has {sim.endpoints}, {sim.error})",
    )
    return time.monotonic() - start


def test_sidecars_on_two_replicas_see_each_other_and_a_leave_reaches_both(
    replicas: tuple[MgmtServer, MgmtServer], mesh: tuple[MeshCluster, SimLoop]
) -> None:
    a, b = replicas
    cluster, loop = mesh
    web = loop.start(_sim(cluster, WEB), a.grpc_port)
    api1 = loop.start(_sim(cluster, API1), b.grpc_port)
    api2 = loop.start(_sim(cluster, API2), a.grpc_port)
    _sees(web, API_CLUSTER, [PORTS["api-1"], PORTS["api-2"]])
    _sees(api1, WEB_CLUSTER, [PORTS["web-1"]])
    _sees(api1, API_CLUSTER, [PORTS["api-1"], PORTS["api-2"]])
    loop.stop(api2)  # the sidecar hangs up: it leaves on A, and B hears it
    on_a = _sees(web, API_CLUSTER, [PORTS["api-1"]])
    on_b = _sees(api1, API_CLUSTER, [PORTS["api-1"]])
    assert max(on_a, on_b) < 5, (on_a, on_b)
    loop.stop(web)
    loop.stop(api1)


def test_kill_9_and_sigterm_of_a_replica_take_no_endpoint_away(
    replicas: tuple[MgmtServer, MgmtServer], mesh: tuple[MeshCluster, SimLoop]
) -> None:
    a, b = replicas
    cluster, loop = mesh
    web = loop.start(_sim(cluster, WEB), a.grpc_port)
    api1 = loop.start(_sim(cluster, API1), b.grpc_port)
    api2 = loop.start(_sim(cluster, API2), a.grpc_port)
    both = [PORTS["api-1"], PORTS["api-2"]]
    _sees(api1, API_CLUSTER, both)
    _sees(api1, WEB_CLUSTER, [PORTS["web-1"]])
    _sees(web, API_CLUSTER, both)

    a.kill9()  # web and api2 lose their streams; their pods still run
    wait_until(lambda: bool(web.error and api2.error), 30, "A's streams to fail")
    # B keeps them: a write after the crash (api-1 reconnecting) recompiles B's view.
    loop.stop(api1)
    again = loop.start(_sim(cluster, API1), b.grpc_port)
    _sees(again, API_CLUSTER, both)
    _sees(again, WEB_CLUSTER, [PORTS["web-1"]])

    a.start()  # the same address: the sidecars reconnect to it
    first = _first_clusters(loop.start(_sim(cluster, WEB), a.grpc_port))
    assert first[API_CLUSTER] == both and first[WEB_CLUSTER] == [PORTS["web-1"]], first

    b.stop()  # SIGTERM: api-1 (on B) loses its stream, and stays an endpoint
    restarted = _first_clusters(loop.start(_sim(cluster, API2), a.grpc_port))
    assert restarted[API_CLUSTER] == both, restarted
    b.start()
    back = _first_clusters(loop.start(_sim(cluster, API1), b.grpc_port))
    assert back[API_CLUSTER] == both and back[WEB_CLUSTER] == [PORTS["web-1"]], back


def _first_clusters(sim: SimSidecar) -> dict[str, list[int]]:
    """The endpoints of the first clusters response a new stream gets."""
    wait_until(lambda: bool(sim.endpoints or sim.error), 30, f"{sim.node.instance}'s clusters")
    assert not sim.error, sim.error
    return dict(sim.endpoints)
