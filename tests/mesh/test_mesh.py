"""The mesh: workloads in two namespaces behind real sidecar Envoys configured over ADS.

One stack for the module: mgmt-api, three workloads (``a`` and ``b`` in
``ns1``, ``c`` in ``ns2``), each behind its sidecar. Calls go app → its
sidecar's outbound listener (by service name) → the callee's sidecar's
inbound listener → the callee app.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from meshplane.sidecar_contract import SIDECAR_KIND
from tests.support.mesh import MeshStack


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MeshStack]:
    stack = MeshStack(Path(tmp_path_factory.mktemp("mesh")))
    try:
        stack.workload("a", "ns1", "sa-a")
        stack.workload("b", "ns1", "sa-b")
        stack.workload("c", "ns2", "sa-c")
        stack.sidecars_converged()
        yield stack
    finally:
        stack.close()


def test_every_sidecar_shows_in_the_status_with_its_ack(mesh: MeshStack) -> None:
    status = mesh.sidecars_converged()
    sidecars = {i["instance"] for i in status["instances"] if i["kind"] == SIDECAR_KIND}
    assert sidecars == {"ns1-a", "ns1-b", "ns2-c"}
    assert status["desiredVersions"][SIDECAR_KIND]


def test_services_are_reached_by_name_through_both_sidecars(mesh: MeshStack) -> None:
    a, b, c = mesh.workloads
    for caller, callee in ((a, b), (a, c), (c, a), (b, b)):
        response = caller.call(callee)
        assert response.status_code == 200, (caller.name, callee.name, response.text)
        assert response.json()["app"] == callee.name
    # Bare service names resolve in the caller's own namespace only.
    assert a.client.get("/", headers={"host": "b"}).json()["app"] == "b"
    assert c.client.get("/", headers={"host": "b"}).status_code == 404
    assert a.client.get("/", headers={"host": "nope.ns1"}).status_code == 404


def test_a_sidecar_that_leaves_is_no_endpoint_and_one_that_joins_is(mesh: MeshStack) -> None:
    a = mesh.workloads[0]
    d = mesh.workload("d", "ns2", "sa-d")
    mesh.sidecars_converged()
    assert a.call(d).json()["app"] == "d"
    d.stop()
    mesh.workloads.remove(d)
    mesh.sidecars_converged()
    assert a.call(d).status_code == 404
