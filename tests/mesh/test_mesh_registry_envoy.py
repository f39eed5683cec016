"""Endpoints that outlive mgmt-api: real sidecar Envoys (each run by its pod agent), calls flowing.

One stack for the module: two mgmt-api replicas sharing PostgreSQL, four
workloads whose sidecar agents stream from either (``a``, ``b`` on replica A;
``c``, ``d`` on replica B). Every caller reaches every callee by name over
mTLS while, in turn, replica B is killed with -9 and restarted on the same
address, then replica A is stopped with SIGTERM and restarted: not one call
fails. The
reconnecting sidecars' first configuration from the restarted replica already
holds every endpoint (the registry is in the store, not in the replica). A
second stack, one replica on SQLite with three workloads, restarts its only
mgmt-api (SIGTERM, then kill -9) with calls flowing: not one fails either.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from meshplane.sidecar_contract import SIDECAR_KIND
from tests.distribution.test_replicas import database  # noqa: F401 - a fixture
from tests.mgmt_api.harness import MgmtServer, ok
from tests.support.gateway import CLUSTER_PATH
from tests.support.mesh import CallLoop, MeshStack, Workload
from tests.support.postgres import PostgresServer
from tests.support.processes import wait_until


class _On:
    """The stack as one workload sees it: its agent streams from ``server``."""

    def __init__(self, stack: MeshStack, server: MgmtServer) -> None:
        self.stack, self.server = stack, server
        self.tmp, self.issuer = stack.tmp, stack.issuer

    @property
    def control_plane(self) -> str:
        return f"grpc://127.0.0.1:{self.server.grpc_port}"

    def agent_args(self) -> list[str]:
        return self.stack.agent_args()

    def agent_env(self) -> dict[str, str] | None:
        return self.stack.agent_env()


@pytest.fixture(scope="module")
def mesh(
    tmp_path_factory: pytest.TempPathFactory,
    database: tuple[PostgresServer, str],  # noqa: F811 - the fixture
) -> Iterator[MeshStack]:
    stack = MeshStack(
        Path(tmp_path_factory.mktemp("mesh-registry")), database_url=database[1], services=False
    )
    try:
        assert stack.mgmt is not None and stack.replica_b is not None
        stack.add(
            *(
                Workload(_On(stack, server), name, ns, f"sa-{name}")
                for name, ns, server in (
                    ("a", "ns1", stack.mgmt),
                    ("b", "ns1", stack.mgmt),
                    ("c", "ns2", stack.replica_b),
                    ("d", "ns2", stack.replica_b),
                )
            )
        )
        _every_pair_calls(stack)
        yield stack
    finally:
        stack.close()


def _answers(caller: Workload, callee: Workload) -> bool:
    """Whether ``caller`` reaches ``callee``; False while its outbound listener is not up yet."""
    try:
        return caller.call(callee).status_code == 200
    except httpx.TransportError:
        return False


def _every_pair_calls(stack: MeshStack) -> None:
    """Wait until every workload reaches every other (the agents start side by side)."""
    pairs = list(itertools.permutations(stack.workloads, 2))
    wait_until(lambda: all(_answers(x, y) for x, y in pairs), 90, "every pair to call")


def _connected(server: MgmtServer, instances: set[str]) -> None:
    """Wait until ``server`` holds the ADS streams of ``instances`` again."""

    def done() -> bool:
        with server.admin() as admin:
            status: dict[str, Any] = ok(admin.get(f"{CLUSTER_PATH}/status"))
        held = {
            i["instance"]
            for i in status["instances"]
            if i["kind"] == SIDECAR_KIND and i["connected"]
        }
        return instances <= held

    wait_until(done, 90, f"{sorted(instances)} to reconnect")


@pytest.mark.parametrize(("replica", "stop"), [("B", "kill -9"), ("A", "SIGTERM")])
def test_a_replica_going_away_and_coming_back_fails_no_call(
    mesh: MeshStack, replica: str, stop: str
) -> None:
    assert mesh.mgmt is not None and mesh.replica_b is not None
    server = mesh.mgmt if replica == "A" else mesh.replica_b
    held = {w.node.instance for w in mesh.workloads[:2] if replica == "A"} | {
        w.node.instance for w in mesh.workloads[2:] if replica == "B"
    }
    with CallLoop(list(itertools.permutations(mesh.workloads, 2)), pause=0.01) as load:
        load.more(24)
        if stop == "kill -9":
            server.kill9()
        else:
            server.stop()
        load.more(48)  # calls go on while the replica is away
        server.start()  # the same address: the agents reconnect to it
        _connected(server, held)
        load.more(48)
    assert load.failures == [], load.failures[:5]


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MeshStack]:
    """One mgmt-api (SQLite) and three workloads, every sidecar streaming from it."""
    stack = MeshStack(Path(tmp_path_factory.mktemp("mesh-single")), services=False)
    try:
        stack.workloads_started(
            *((name, ns, f"sa-{name}") for name, ns in (("a", "ns1"), ("b", "ns1"), ("c", "ns2")))
        )
        _every_pair_calls(stack)
        yield stack
    finally:
        stack.close()


@pytest.mark.parametrize("stop", ["SIGTERM", "kill -9"])
def test_the_only_replica_restarting_fails_no_call(single: MeshStack, stop: str) -> None:
    server = single.mgmt
    assert server is not None
    with CallLoop(list(itertools.permutations(single.workloads, 2)), pause=0.01) as load:
        load.more(18)
        if stop == "kill -9":
            server.kill9()
        else:
            server.stop()
        load.more(36)
        server.start()
        _connected(server, {w.node.instance for w in single.workloads})
        load.more(36)
    assert load.failures == [], load.failures[:5]
