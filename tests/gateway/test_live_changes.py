"""Live configuration over ADS: three gateways of one cluster follow REST changes.

No gateway is restarted in this module: every change is made over REST and
must reach every gateway of the cluster, show as that gateway's ACK in the
cluster status, and be enforced at each of them. Counters are global across
the gateways (spec 4.10.4): they share the ratelimit service and its Redis.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from meshplane.gateway_contract import GATEWAY_KIND
from tests.support.gateway import Gateway, GatewayStack
from tests.support.processes import wait_until


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayStack]:
    st = GatewayStack(Path(tmp_path_factory.mktemp("gateways")))
    try:
        st.backend("default.app")
        st.route("default.web", "/web")
        for _ in range(3):
            st.gateway()
        st.converged()
        yield st
    finally:
        st.close()


def limit_header(stack: GatewayStack, index: int) -> str | None:
    value: str | None = stack.gateways[index].get("/web").headers.get("x-ratelimit-limit")
    return value


def shows_limit(stack: GatewayStack, index: int, limit: str) -> bool:
    return limit_header(stack, index) == limit


def serves(gateway: Gateway, path: str) -> bool:
    return gateway.get(path).status_code == 200


def unlimited(gateway: Gateway) -> bool:
    return "x-ratelimit-limit" not in gateway.get("/web").headers


def test_every_gateway_shows_its_ack_in_the_cluster_status(stack: GatewayStack) -> None:
    status = stack.converged()
    gateways = [i for i in status["instances"] if i["kind"] == GATEWAY_KIND]
    assert sorted(i["instance"] for i in gateways) == ["gw-1", "gw-2", "gw-3"]
    for entry in gateways:
        assert entry["connected"] and not entry["stale"]
        assert entry["lastResult"] == "ACK"
        assert entry["appliedVersion"] == status["desiredVersions"][GATEWAY_KIND]
        assert entry["upToDate"] is True


def test_a_new_policy_reaches_every_gateway_without_a_restart(stack: GatewayStack) -> None:
    pids = [g.envoy.pid for g in stack.gateways]
    assert all(limit_header(stack, i) is None for i in range(3))
    stack.rate_limit("default.web-limit", "web", (4, "Minute"))
    stack.converged()
    for i in range(3):
        wait_until(partial(shows_limit, stack, i, "4, 4;w=60"), 30, f"gateway {i + 1}")
    assert [g.envoy.pid for g in stack.gateways] == pids


def test_counters_are_shared_by_every_gateway(stack: GatewayStack) -> None:
    assert stack.redis is not None
    stack.rate_limit("default.web-limit", "web", (4, "Hour"))
    stack.converged()
    for i in range(3):
        wait_until(partial(shows_limit, stack, i, "4, 4;w=3600"), 30, f"gateway {i + 1}")
    stack.redis.command("FLUSHALL")
    codes = [stack.gateways[i % 3].get("/web").status_code for i in range(4)]
    assert codes == [200, 200, 200, 200]
    assert {g.get("/web").status_code for g in stack.gateways} == {429}


def test_a_new_route_is_served_by_every_gateway(stack: GatewayStack) -> None:
    assert {g.get("/new").status_code for g in stack.gateways} == {404}
    stack.route("default.new", "/new")
    stack.converged()
    for gateway in stack.gateways:
        wait_until(partial(serves, gateway, "/new"), 30, "the new route")


def test_a_deleted_policy_stops_limiting(stack: GatewayStack) -> None:
    stack.delete("backendtrafficpolicies/default.web-limit")
    stack.converged()
    for gateway in stack.gateways:
        wait_until(partial(unlimited, gateway), 30, "no limit")
    assert {g.get("/web").status_code for g in stack.gateways} == {200}
