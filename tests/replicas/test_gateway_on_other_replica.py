"""A policy change made on replica A reaches a gateway attached to replica B.

Two mgmt-api replicas on one real PostgreSQL; the ratelimit and extauthz
services and a real gateway Envoy attach (policy streams, ADS) to replica B
only, while every REST write goes to replica A. The replicas run with the
safety-net poll set to an hour, so a change that arrives at all crossed the
replicas through PostgreSQL ``NOTIFY``; the gateway then enforces it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from meshplane.gateway_contract import GATEWAY_KIND
from tests.distribution.test_replicas import database  # noqa: F401 - a fixture
from tests.support.gateway import GatewayStack
from tests.support.postgres import PostgresServer
from tests.support.processes import wait_until


@pytest.fixture(scope="module")
def stack(
    database: tuple[PostgresServer, str],  # noqa: F811 - the imported fixture
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GatewayStack]:
    mp = pytest.MonkeyPatch()
    mp.setenv("MESHPLANE_REVISION_POLL", "1h")
    st: GatewayStack | None = None
    try:
        st = GatewayStack(Path(tmp_path_factory.mktemp("gateway-b")), database_url=database[1])
        st.backend("default.app")
        st.route("default.web", "/web")
        st.gateway()
        st.converged()
        yield st
    finally:
        mp.undo()
        if st is not None:
            st.close()


def test_a_policy_written_on_replica_a_is_enforced_by_a_gateway_on_replica_b(
    stack: GatewayStack,
) -> None:
    gateway = stack.gateways[0]
    assert stack.replica_b is not None
    assert gateway.get("/web").status_code == 200  # the route came over replica B's ADS
    assert gateway.get("/web").headers.get("x-ratelimit-limit") is None
    stack.rate_limit("default.web-limit", "web", (3, "Minute"))  # on replica A
    wait_until(
        lambda: gateway.get("/web").headers.get("x-ratelimit-limit") == "3, 3;w=60",
        timeout=60,
        what="the limit written on replica A enforced by the gateway on replica B",
    )
    status = stack.converged()
    gateways = [i for i in status["instances"] if i["kind"] == GATEWAY_KIND]
    assert [g["appliedVersion"] for g in gateways] == [status["desiredVersions"][GATEWAY_KIND]]
    codes = [gateway.get("/web").status_code for _ in range(6)]
    assert 429 in codes, codes
