"""The deploy examples: the Envoy gateway bootstrap parses into Envoy's protos
(typed_config Any's included), and its route actions produce descriptors that
the example rate-limit config limits as intended."""

from __future__ import annotations

from pathlib import Path

import yaml
from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.config.route.v3 import route_components_pb2
from envoy.extensions.filters.http.ratelimit.v3 import rate_limit_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2  # noqa: F401 - Any type
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2,
)
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2  # noqa: F401 - Any type
from google.protobuf import json_format

from ratelimit.config import load_config
from ratelimit.matching import match_descriptor

ROOT = Path(__file__).resolve().parents[2]
BOOTSTRAP = ROOT / "deploy/envoy/ratelimit-gateway.yaml"
RL_CONFIG = ROOT / "deploy/ratelimit/config"


def parse_bootstrap() -> bootstrap_pb2.Bootstrap:
    return json_format.ParseDict(yaml.safe_load(BOOTSTRAP.read_text()), bootstrap_pb2.Bootstrap())


def hcm_of(bootstrap: bootstrap_pb2.Bootstrap) -> http_connection_manager_pb2.HttpConnectionManager:
    hcm = http_connection_manager_pb2.HttpConnectionManager()
    assert (
        bootstrap.static_resources.listeners[0].filter_chains[0].filters[0].typed_config.Unpack(hcm)
    )
    return hcm


def descriptors_for(
    route: route_components_pb2.Route, headers: dict[str, str], client_ip: str
) -> list[list[tuple[str, str]]]:
    """What Envoy generates for a request: an entry list per rate_limit, or none
    when an action cannot produce its entry (e.g. a missing header)."""
    out = []
    for rate_limit in route.route.rate_limits:
        entries: list[tuple[str, str]] | None = []
        for action in rate_limit.actions:
            kind = action.WhichOneof("action_specifier")
            assert entries is not None
            if kind == "generic_key":
                key = action.generic_key.descriptor_key or "generic_key"
                entries.append((key, action.generic_key.descriptor_value))
            elif kind == "request_headers":
                value = headers.get(action.request_headers.header_name)
                if value is None:
                    entries = None
                    break
                entries.append((action.request_headers.descriptor_key, value))
            elif kind == "remote_address":
                entries.append(("remote_address", client_ip))
            else:  # pragma: no cover - the example uses only the kinds above
                raise AssertionError(f"unexpected action {kind}")
        if entries:
            out.append(entries)
    return out


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
        for entries in descriptors_for(routes[route], headers, "203.0.113.7"):
            match = match_descriptor(domain, entries)
            result.append(
                None if match is None else (match.limit.requests_per_unit, match.limit.shadow_mode)
            )
        return result

    assert limits("checkout", {"x-user-id": "alice"}) == [(100, False), (10, False), (2, False)]
    assert limits("checkout", {}) == [(100, False)]  # no user header: only the route limit
    assert limits("checkout", {"x-user-id": "loadtest"}) == [(100, False), None, None]
    assert limits("default", {}) == [(1000, True)]
