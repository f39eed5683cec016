"""The example Envoy bootstrap parses into the Bootstrap proto, typed configs included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envoy.extensions.filters.http.ext_authz.v3 import ext_authz_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)

from extauthz.config import POLICY_CONTEXT_KEY, load_config
from tests.support.envoy_protos import parse_bootstrap

ROOT = Path(__file__).parents[2]


def load_bootstrap() -> Any:
    return parse_bootstrap(ROOT / "deploy" / "envoy" / "extauthz.yaml")


def test_bootstrap_wires_ext_authz_with_policy_context_extensions() -> None:
    bootstrap = load_bootstrap()
    policies = load_config(ROOT / "deploy" / "extauthz" / "demo-policy.yaml").policies
    listeners = {listener.name: listener for listener in bootstrap.static_resources.listeners}
    hcm = hcm_pb2.HttpConnectionManager()
    assert listeners["grpc_check"].filter_chains[0].filters[0].typed_config.Unpack(hcm)
    assert hcm.normalize_path.value and hcm.merge_slashes
    filters = [f.name for f in hcm.http_filters]
    assert filters == ["envoy.filters.http.ext_authz", "envoy.filters.http.router"]
    ext = ext_authz_pb2.ExtAuthz()
    assert hcm.http_filters[0].typed_config.Unpack(ext)
    assert ext.grpc_service.envoy_grpc.cluster_name == "extauthz"
    assert not ext.failure_mode_allow
    selected = []
    for route in hcm.route_config.virtual_hosts[0].routes:
        per_route = ext_authz_pb2.ExtAuthzPerRoute()
        assert route.typed_per_filter_config["envoy.filters.http.ext_authz"].Unpack(per_route)
        if per_route.disabled:
            continue
        selected.append(per_route.check_settings.context_extensions[POLICY_CONTEXT_KEY])
    assert selected and all(name in policies for name in selected)
    clusters = {c.name: c for c in bootstrap.static_resources.clusters}
    assert "envoy.extensions.upstreams.http.v3.HttpProtocolOptions" in (
        clusters["extauthz"].typed_extension_protocol_options
    )


def test_http_mode_listener_uses_check_prefix_of_a_known_policy() -> None:
    bootstrap = load_bootstrap()
    policies = load_config(ROOT / "deploy" / "extauthz" / "demo-policy.yaml").policies
    listener = next(lst for lst in bootstrap.static_resources.listeners if lst.name == "http_check")
    hcm = hcm_pb2.HttpConnectionManager()
    assert listener.filter_chains[0].filters[0].typed_config.Unpack(hcm)
    ext = ext_authz_pb2.ExtAuthz()
    assert hcm.http_filters[0].typed_config.Unpack(ext)
    prefixes = [ext.http_service.path_prefix]
    for route in hcm.route_config.virtual_hosts[0].routes:
        if "envoy.filters.http.ext_authz" in route.typed_per_filter_config:
            per_route = ext_authz_pb2.ExtAuthzPerRoute()
            route.typed_per_filter_config["envoy.filters.http.ext_authz"].Unpack(per_route)
            prefixes.append(per_route.check_settings.http_service.path_prefix)
    for prefix in prefixes:
        assert prefix.startswith("/check/")
        assert prefix.removeprefix("/check/") in policies
