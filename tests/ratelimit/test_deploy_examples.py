"""The deploy examples: the Envoy gateway bootstrap parses into Envoy's protos
(typed_config Any's included), and its route actions produce descriptors that
the example rate-limit config limits as intended."""

from __future__ import annotations

from pathlib import Path

from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.extensions.filters.http.ratelimit.v3 import rate_limit_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2,
)

from ratelimit.config import load_config
from ratelimit.matching import match_descriptor
from tests.support.envoy_protos import descriptors_for, listener_hcm
from tests.support.envoy_protos import parse_bootstrap as parse_file

ROOT = Path(__file__).resolve().parents[2]
BOOTSTRAP = ROOT / "deploy/envoy/ratelimit-gateway.yaml"
RL_CONFIG = ROOT / "deploy/ratelimit/config"


def parse_bootstrap() -> bootstrap_pb2.Bootstrap:
    return parse_file(BOOTSTRAP)


def hcm_of(bootstrap: bootstrap_pb2.Bootstrap) -> http_connection_manager_pb2.HttpConnectionManager:
    return listener_hcm(bootstrap)


def test_bootstrap_parses_into_envoy_protos_with_the_ratelimit_filter() -> None:
    bootstrap = parse_bootstrap()
    hcm = hcm_of(bootstrap)
    filters = {f.name: f for f in hcm.http_filters}
    rl = rate_limit_pb2.RateLimit()
    assert filters["envoy.filters.http.ratelimit"].typed_config.Unpack(rl)
    assert rl.domain == "edge-gateway"
    assert rl.timeout.ToMilliseconds() == 20
    assert rl.rate_limit_service.grpc_service.envoy_grpc.cluster_name == "ratelimit"
    assert "envoy.filters.http.router" in filters
    clusters = {c.name for c in bootstrap.static_resources.clusters}
    assert {"ratelimit", "shop"} <= clusters


def test_route_actions_produce_descriptors_the_config_limits() -> None:
    hcm = hcm_of(parse_bootstrap())
    routes = {r.name: r for r in hcm.route_config.virtual_hosts[0].routes}
    domain = load_config(RL_CONFIG).domains["edge-gateway"]

    def limits(route: str, headers: dict[str, str]) -> list[tuple[int, bool] | None]:
        result: list[tuple[int, bool] | None] = []
        for entries in descriptors_for(routes[route].route.rate_limits, headers, "203.0.113.7"):
            match = match_descriptor(domain, entries)
            result.append(
                None if match is None else (match.limit.requests_per_unit, match.limit.shadow_mode)
            )
        return result

    assert limits("checkout", {"x-user-id": "alice"}) == [(100, False), (10, False), (2, False)]
    assert limits("checkout", {}) == [(100, False)]  # no user header: only the route limit
    assert limits("checkout", {"x-user-id": "loadtest"}) == [(100, False), None, None]
    assert limits("default", {}) == [(1000, True)]
