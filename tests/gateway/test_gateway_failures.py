"""What a gateway does when its configuration is refused, or mgmt-api is gone.

- **A NACK.** The gateway here runs an Envoy without the rate-limit filter
  (``--disable-extensions``), as an Envoy build or version that lacks a
  feature would: when a policy adds the filter, Envoy refuses the listener.
  The status shows the NACK with Envoy's own error, the gateway keeps
  serving its last accepted configuration, and the next version it can take
  is ACKed again.
- **mgmt-api down.** A running gateway keeps serving what it has. A gateway
  that (re)starts while mgmt-api is down has no listener at all (Envoy waits
  for its first configuration, up to its initial fetch timeouts, then runs
  empty) until mgmt-api is back, when it connects by itself
  (docs/gateway.md: what we recommend). The test does not wait those
  timeouts out: it waits until the gateway has been refused by the absent
  mgmt-api, twice, and sees it waiting with no listener.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.nacking import POLICY, REFUSED_FILTER, make_it_nack, stack_with_limited_gateway
from tests.gateway.nacking import gateway_entry as gateway_status
from tests.support.gateway import Gateway, GatewayStack
from tests.support.processes import wait_until


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayStack]:
    with stack_with_limited_gateway(Path(tmp_path_factory.mktemp("gateway-failures"))) as st:
        yield st


def test_a_refused_configuration_is_a_nack_in_the_status_and_the_old_one_serves(
    stack: GatewayStack,
) -> None:
    gateway = stack.gateways[0]
    good = gateway_status(stack, "limited")
    assert good["lastResult"] == "ACK"
    entry = make_it_nack(stack)
    assert REFUSED_FILTER in str(entry["lastError"])
    assert entry["nackedVersion"] == entry["desired"]
    assert entry["appliedVersion"] == good["appliedVersion"]
    assert entry["upToDate"] is False
    # The last accepted listener still serves, without the limit it refused.
    responses = [gateway.get("/web") for _ in range(4)]
    assert [r.status_code for r in responses] == [200] * 4
    assert all("x-ratelimit-limit" not in r.headers for r in responses)

    stack.delete(f"backendtrafficpolicies/{POLICY}")
    wait_until(lambda: gateway_status(stack, "limited")["lastResult"] == "ACK", 60, "an ACK")
    entry = gateway_status(stack, "limited")
    assert entry["appliedVersion"] == entry["desired"] == good["appliedVersion"]
    assert entry["upToDate"] is True


def xds_connect_failures(gateway: Gateway) -> int:
    """Connections to mgmt-api's gRPC port that Envoy could not open."""
    stats = gateway.envoy.admin("GET", "/stats?filter=^cluster.meshplane_xds.").text
    return sum(
        int(value)
        for name, _, value in (line.partition(": ") for line in stats.splitlines())
        if name.endswith("upstream_cx_connect_fail")
    )


def refuses(gateway: Gateway) -> bool:
    try:
        gateway.get("/web", timeout=2)
    except httpx.ConnectError:
        return True
    return False


def test_mgmt_api_down_the_running_gateway_serves_and_a_restarted_one_waits(
    stack: GatewayStack,
) -> None:
    assert stack.mgmt is not None
    running = stack.gateway("running")
    stack.converged()
    assert running.get("/web").status_code == 200

    stack.mgmt.stop()
    try:
        # Envoy keeps its last configuration while the control plane is away.
        assert [running.get("/web").status_code for _ in range(3)] == [200] * 3

        # The same gateway, restarted now, has nothing to serve: once it has tried
        # mgmt-api and been refused (twice: the first attempt and a retry), it is
        # still waiting for its first configuration, with no listener.
        running.stop()
        stack.gateways.remove(running)
        restarted = stack.gateway("running", port=running.port, wait_ready=False)
        wait_until(lambda: xds_connect_failures(restarted) >= 2, 60, "refused ADS connections")
        assert restarted.envoy.admin("GET", "/ready").text.strip() != "LIVE"
        assert refuses(restarted)
    finally:
        stack.mgmt.start()
    # Back: the gateway connects by itself (Envoy retries with backoff) and serves.
    wait_until(
        lambda: not refuses(restarted) and restarted.get("/web").status_code == 200,
        90,
        "the restarted gateway to serve",
    )
    stack.converged()
