"""A gateway that NACKs on demand, for the tests of what the status shows.

The gateway runs an Envoy without the rate-limit filter
(``--disable-extensions``), as an Envoy build or version that lacks a
feature would: once a BackendTrafficPolicy adds the filter to its route,
Envoy refuses the listener, NACKs with its own error and keeps serving its
last accepted configuration.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from meshplane.gateway_contract import GATEWAY_KIND
from tests.support.gateway import GatewayStack
from tests.support.processes import wait_until

WITHOUT_RATELIMIT = ("--disable-extensions", "envoy.filters.http/envoy.filters.http.ratelimit")
#: The route the limit targets and what Envoy's refusal names.
ROUTE, POLICY = "web", "default.web-limit"
REFUSED_FILTER = "envoy.filters.http.ratelimit"


@contextmanager
def stack_with_limited_gateway(tmp: Path, instance: str = "limited") -> Iterator[GatewayStack]:
    """A converged stack: one route, one gateway that cannot take a rate limit;
    everything it started is stopped on exit."""
    stack = GatewayStack(tmp)
    try:
        stack.backend("default.app")
        stack.route(f"default.{ROUTE}", f"/{ROUTE}")
        stack.gateway(instance, extra_args=WITHOUT_RATELIMIT)
        stack.converged()
        yield stack
    finally:
        stack.close()


def gateway_entry(stack: GatewayStack, instance: str) -> dict[str, Any]:
    """The gateway's row of the cluster status, with the version it should run."""
    status = stack.status()
    mine = [
        i for i in status["instances"] if i["kind"] == GATEWAY_KIND and i["instance"] == instance
    ]
    assert len(mine) == 1, status
    return {**mine[0], "desired": status["desiredVersions"][GATEWAY_KIND]}


def make_it_nack(stack: GatewayStack, instance: str = "limited") -> dict[str, Any]:
    """Add the rate limit the gateway cannot take; return its row once it NACKed."""
    stack.rate_limit(POLICY, ROUTE, (2, "Minute"))

    def nacked() -> dict[str, Any] | None:
        entry = gateway_entry(stack, instance)
        nack = entry["lastResult"] == "NACK" and entry["nackedVersion"] == entry["desired"]
        return entry if nack else None

    return wait_until(nacked, 60, "the gateway to NACK")
