"""``GET .../clusters/{cluster}/envoyconfig``: the gateway's half of the cluster's policies.

Every rendered piece is parsed into Envoy's own protos (unknown fields
rejected, ``@type`` resolved), assembled into a bootstrap, and the route
actions are run as Envoy would run them against the descriptors the
ratelimit service loads for the same policies. Every document a test gets is
also run through ``envoy --mode validate`` (``tests.support.envoy.get_envoyconfig``).
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.route.v3 import route_components_pb2
from envoy.extensions.filters.http.ext_authz.v3 import ext_authz_pb2
from envoy.extensions.filters.http.ratelimit.v3 import rate_limit_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)

from extauthz.config import POLICY_CONTEXT_KEY
from mgmt_api.compiler import envoy_config
from mgmt_api.compiler.envoy_config import CHECK_HEADERS
from mgmt_api.compiler.ratelimit import render_rls_files
from mgmt_api.compiler.traffic_policy import BackendTrafficPolicy
from ratelimit.config import load_config
from ratelimit.matching import match_descriptor
from tests.mgmt_api.harness import MgmtServer, err, ok, unique
from tests.mgmt_api.rbac_helpers import grant
from tests.support.envoy import assert_envoy_accepts, envoy_config_bootstrap, get_envoyconfig
from tests.support.envoy_protos import (
    descriptors_for,
    listener_hcm,
    parse,
    parse_bootstrap,
    parse_typed,
    unpack,
)

RULES: list[dict[str, Any]] = [
    {  # 0: alice of an org that is not a test org
        "clientSelectors": [
            {
                "headers": [
                    {"name": "x-user-id", "value": "alice"},
                    {
                        "name": "x-org",
                        "type": "RegularExpression",
                        "value": "test.*",
                        "invert": True,
                    },
                ]
            }
        ],
        "limit": {"requests": 3, "unit": "Minute"},
    },
    {  # 1: per tenant, each request costs 2
        "clientSelectors": [{"headers": [{"name": "x-tenant", "type": "Distinct"}]}],
        "limit": {"requests": 10, "unit": "Hour"},
        "cost": {"request": 2},
    },
    {  # 2: the 10/8 network as a whole
        "clientSelectors": [{"sourceCIDR": {"value": "10.0.0.0/8"}}],
        "limit": {"requests": 5, "unit": "Second"},
    },
    {  # 3: each client of 192.168/16 on its own
        "clientSelectors": [{"sourceCIDR": {"type": "Distinct", "value": "192.168.0.0/16"}}],
        "limit": {"requests": 1, "unit": "Minute"},
    },
    {"limit": {"requests": 100, "unit": "Day"}, "shadowMode": True},  # 4: everyone
]

TRAFFIC_POLICY: dict[str, Any] = {
    "apiVersion": "gateway.envoyproxy.io/v1alpha1",
    "kind": "BackendTrafficPolicy",
    "spec": {
        "targetRef": {"kind": "HTTPRoute", "name": "web"},
        "rateLimit": {"type": "Global", "global": {"rules": RULES}},
    },
}

EXTAUTHZ_POLICY = {
    "jwt": {
        "algorithms": ["HS256"],
        "keys": [{"hmacSecret": {"value": "a-long-test-secret-of-32-bytes-or-more"}}],
    },
    "pathClaim": {"name": "path", "match": "PREFIX"},
}


def _group(admin: httpx.Client, org: str, workspace: str, group: str, names: list[str]) -> str:
    base = f"/v2/organizations/{org}/tenants/t"
    ok(
        admin.post(
            f"{base}/workspaces",
            json={"name": workspace, "workspace": {"namespaceSelector": {"names": names}}},
        )
    )
    path = f"{base}/workspaces/{workspace}/securitygroups/{group}"
    ok(
        admin.post(
            f"{base}/workspaces/{workspace}/securitygroups",
            json={"name": group, "securityGroup": {"configMode": "BRIDGED"}},
        )
    )
    return path


def _setting(
    admin: httpx.Client, group: str, uri: str, policy: str, headers: list[str] | None = None
) -> None:
    external: dict[str, Any] = {"uri": uri, "policy": policy}
    if headers is not None:
        external["includeRequestHeadersInCheck"] = headers
    body = {"authorization": {"mode": "CLUSTER", "http": {"external": external}}}
    ok(admin.post(f"{group}/settings", json={"name": "authz", "securitySetting": body}))
    ok(
        admin.post(
            f"{group}/extauthzpolicies", json={"name": policy, "extAuthzPolicy": EXTAUTHZ_POLICY}
        )
    )


def _filter(config: dict[str, Any], short: str) -> dict[str, Any]:
    """The typed config of the document's ``envoy.filters.http.{short}`` filter."""
    (found,) = [
        f["typedConfig"]
        for f in config["httpFilters"]
        if f["name"] == f"envoy.filters.http.{short}"
    ]
    return dict(found)


@pytest.fixture
def cluster(admin: httpx.Client, org: str) -> str:
    """Cluster ``east`` (failing closed) with one traffic policy and one ext_authz
    setting; a second group only selects cluster ``west``."""
    base = f"/v2/organizations/{org}"
    ok(
        admin.post(
            f"{base}/clusters",
            json={"name": "east", "cluster": {"rateLimit": {"failureMode": "deny"}}},
        )
    )
    ok(
        admin.post(
            f"{base}/clusters/east/backendtrafficpolicies",
            json={"name": "shop.web-limits", "backendTrafficPolicy": TRAFFIC_POLICY},
        )
    )
    ok(admin.post(f"{base}/tenants", json={"name": "t", "tenant": {}}))
    _setting(admin, _group(admin, org, "w", "g", ["east/shop"]), "grpc://authz.east:9191", "jwt")
    _setting(admin, _group(admin, org, "w2", "g2", ["west/*"]), "grpc://authz.west:9191", "jwt")
    return f"{base}/clusters/east"


def _compiled_domain(cluster: str) -> Any:
    """The domain the ratelimit service loads for TRAFFIC_POLICY, via its own loader."""
    doc = {**TRAFFIC_POLICY, "metadata": {"namespace": "shop", "name": "web-limits"}}
    policy = BackendTrafficPolicy.model_validate(doc)
    with tempfile.TemporaryDirectory() as tmp:
        for name, content in render_rls_files(cluster, [policy]).items():
            (Path(tmp) / name).write_bytes(content)
        return load_config(Path(tmp)).domains[f"{cluster}/shop/web-limits"]


def test_filters_routes_and_clusters_parse_into_envoys_protos(
    admin: httpx.Client, cluster: str
) -> None:
    config = get_envoyconfig(admin, cluster)
    assert config["cluster"] == cluster.removeprefix("/v2/")
    # The policy targets route shop/web, which nobody created (see the next test).
    assert [w.split(",")[0] for w in config["warnings"]] == [
        f"BackendTrafficPolicy {cluster.removeprefix('/v2/')}/backendtrafficpolicies/"
        "shop.web-limits targets HTTPRoute shop/web"
    ]
    for piece in config["httpFilters"]:
        parse(piece, hcm_pb2.HttpFilter())
    for piece in config["clusters"]:
        parse(piece, cluster_pb2.Cluster())
    hcm = listener_hcm(parse_bootstrap(envoy_config_bootstrap(config)))
    # The policy runs inside Envoy (jwt_authn and the Lua check), ext_authz
    # behind them for what the check refers (docs/gateway.md).
    assert [f.name for f in hcm.http_filters] == [
        "envoy.filters.http.jwt_authn",
        "envoy.filters.http.lua",
        "envoy.filters.http.ext_authz",
        "envoy.filters.http.ratelimit",
        "envoy.filters.http.router",
    ]
    assert len(hcm.route_config.virtual_hosts[0].routes) == 2


def test_ext_authz_filter_calls_the_settings_server_and_routes_select_its_policy(
    admin: httpx.Client, cluster: str
) -> None:
    config = get_envoyconfig(admin, cluster)
    ext = parse_typed(_filter(config, "ext_authz"), ext_authz_pb2.ExtAuthz())
    assert not ext.failure_mode_allow
    assert ext.status_on_error.code == 503
    clusters = {c["name"]: parse(c, cluster_pb2.Cluster()) for c in config["clusters"]}
    upstream = clusters[ext.grpc_service.envoy_grpc.cluster_name]
    address = upstream.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address
    assert (address.socket_address.address, address.socket_address.port_value) == (
        "authz.east",
        9191,
    )
    assert "envoy.extensions.upstreams.http.v3.HttpProtocolOptions" in (
        upstream.typed_extension_protocol_options
    )
    (route,) = [r for r in config["routes"] if "workloads" in r]
    org = cluster.split("/")[3]
    group = f"organizations/{org}/tenants/t/workspaces/w/securitygroups/g"
    assert route["workloads"] == {"securityGroup": group, "namespaces": ["shop"]}
    assert route["setting"] == f"{group}/settings/authz"
    assert route["enforcement"]["path"] == "local"
    per_route = parse_typed(
        route["typedPerFilterConfig"]["envoy.filters.http.ext_authz"],
        ext_authz_pb2.ExtAuthzPerRoute(),
    )
    # The name under which the cluster's ext_authz file publishes the policy.
    assert dict(per_route.check_settings.context_extensions) == {POLICY_CONTEXT_KEY: "t.w.g.jwt"}
    # The Check carries the headers extauthz reads, without Envoy's own call headers.
    assert [m.exact for m in ext.allowed_headers.patterns] == sorted(CHECK_HEADERS)
    assert ext.grpc_service.envoy_grpc.skip_envoy_headers


def test_include_request_headers_in_check_adds_to_what_the_check_carries(
    admin: httpx.Client, org: str
) -> None:
    """A server of one's own that reads more headers names them on the setting;
    the filter of a server sends what any of its settings names."""
    base = f"/v2/organizations/{org}"
    ok(admin.post(f"{base}/clusters", json={"name": "east", "cluster": {}}))
    ok(admin.post(f"{base}/tenants", json={"name": "t", "tenant": {}}))
    group = _group(admin, org, "w", "g", ["east/shop"])
    _setting(admin, group, "grpc://own:9191", "jwt", ["X-Api-Key", "traceparent"])
    config = get_envoyconfig(admin, f"{base}/clusters/east")
    ext = parse_typed(_filter(config, "ext_authz"), ext_authz_pb2.ExtAuthz())
    assert [m.exact for m in ext.allowed_headers.patterns] == [
        "authorization",
        "traceparent",
        "tracestate",
        "x-api-key",
    ]
    bad = {"uri": "grpc://own:9191", "includeRequestHeadersInCheck": ["ok", "no space"]}
    body = {"authorization": {"mode": "CLUSTER", "http": {"external": bad}}}
    response = admin.post(f"{group}/settings", json={"name": "bad", "securitySetting": body})
    assert response.status_code == 400, response.text
    assert "includeRequestHeadersInCheck[1]" in response.text


def test_ratelimit_filter_follows_the_cluster_failure_mode_and_service_headers(
    admin: httpx.Client, cluster: str
) -> None:
    config = get_envoyconfig(admin, cluster, {"rateLimitService": "grpc://rl:7000"})
    (piece,) = [f for f in config["httpFilters"] if f["name"] == "envoy.filters.http.ratelimit"]
    rl = parse_typed(piece["typedConfig"], rate_limit_pb2.RateLimit())
    assert rl.failure_mode_deny  # the cluster's rateLimit.failureMode is deny
    # The ratelimit service adds x-ratelimit-* itself; Envoy must not add them again.
    assert rl.enable_x_ratelimit_headers == rate_limit_pb2.RateLimit.OFF
    assert rl.rate_limit_service.grpc_service.envoy_grpc.cluster_name == "ratelimit"
    assert rl.rate_limit_service.grpc_service.envoy_grpc.skip_envoy_headers
    (service,) = [c for c in config["clusters"] if c["name"] == "ratelimit"]
    address = parse(service, cluster_pb2.Cluster()).load_assignment.endpoints[0]
    socket = address.lb_endpoints[0].endpoint.address.socket_address
    assert (socket.address, socket.port_value) == ("rl", 7000)
    base = cluster.rsplit("/", 1)[0]
    ok(admin.post(base, json={"name": "open", "cluster": {}}))
    ok(
        admin.post(
            f"{base}/open/backendtrafficpolicies",
            json={"name": "shop.web-limits", "backendTrafficPolicy": TRAFFIC_POLICY},
        )
    )
    open_config = get_envoyconfig(admin, f"{base}/open")
    (piece,) = [
        f for f in open_config["httpFilters"] if f["name"] == "envoy.filters.http.ratelimit"
    ]
    assert not parse_typed(piece["typedConfig"], rate_limit_pb2.RateLimit()).failure_mode_deny
    assert not [r for r in open_config["routes"] if "workloads" in r]  # no group selects it


def test_route_actions_send_the_descriptors_the_ratelimit_service_limits(
    admin: httpx.Client, cluster: str
) -> None:
    config = get_envoyconfig(admin, cluster)
    (route,) = [r for r in config["routes"] if "targetRef" in r]
    assert route["targetRef"] == {"kind": "HTTPRoute", "namespace": "shop", "name": "web"}
    assert (
        route["policy"] == f"{cluster.removeprefix('/v2/')}/backendtrafficpolicies/shop.web-limits"
    )
    per_route = parse_typed(
        route["typedPerFilterConfig"]["envoy.filters.http.ratelimit"],
        rate_limit_pb2.RateLimitPerRoute(),
    )
    assert per_route.domain == "east/shop/web-limits"
    assert [r.hits_addend.number.value for r in per_route.rate_limits] == [0, 2, 0, 0, 0]
    domain = _compiled_domain("east")

    def limits(headers: dict[str, str], client: str) -> list[tuple[int, bool] | None]:
        out: list[tuple[int, bool] | None] = []
        for entries in descriptors_for(per_route.rate_limits, headers, client):
            match = match_descriptor(domain, entries)
            out.append(
                None if match is None else (match.limit.requests_per_unit, match.limit.shadow_mode)
            )
        return out

    alice = {"x-user-id": "alice", "x-org": "acme"}
    # rules 0, 2 and 4 apply; rule 3's descriptor is sent but names 10.1.0.0/16, no limit
    assert limits(alice, "10.1.2.3") == [(3, False), (5, False), None, (100, True)]
    # an inverted header match that matches produces no descriptor for rule 0
    assert limits({"x-user-id": "alice", "x-org": "test-1"}, "172.16.0.1") == [
        None,
        None,
        (100, True),
    ]
    assert limits({"x-tenant": "t1"}, "192.168.4.5") == [(10, False), None, (1, False), (100, True)]


def test_yaml_format_is_the_same_document(admin: httpx.Client, cluster: str) -> None:
    as_json = get_envoyconfig(admin, cluster)
    response = admin.get(f"{cluster}/envoyconfig", params={"format": "yaml"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/yaml")
    assert yaml.safe_load(response.text) == as_json
    assert_envoy_accepts(yaml.safe_load(response.text))


def test_needs_read_on_the_cluster(
    server: MgmtServer, admin: httpx.Client, org: str, make_user: Callable[..., httpx.Client]
) -> None:
    base = f"/v2/organizations/{org}/clusters"
    ok(admin.post(base, json={"name": "c1", "cluster": {}}))
    with server.client() as anonymous:
        err(anonymous.get(f"{base}/c1/envoyconfig"), 401)
    name = unique("u")
    with make_user(org, name) as user:
        err(user.get(f"{base}/c1/envoyconfig"), 403)
        grant(
            admin,
            f"organizations/{org}/clusters/c1",
            "rbac/reader",
            {"user": f"organizations/{org}/users/{name}"},
        )
        assert get_envoyconfig(user, f"{base}/c1")["httpFilters"] == []


def test_missing_cluster_and_bad_service_address(admin: httpx.Client, org: str) -> None:
    base = f"/v2/organizations/{org}/clusters"
    err(admin.get(f"{base}/nope/envoyconfig"), 404)
    ok(admin.post(base, json={"name": "c1", "cluster": {}}))
    err(admin.get(f"{base}/c1/envoyconfig", params={"rateLimitService": "http://x:1"}), 400)
    err(admin.get(f"{base}/c1/envoyconfig", params={"rateLimitService": "unix:rl.sock"}), 400)
    get_envoyconfig(admin, f"{base}/c1", {"rateLimitService": "unix:///run/rl.sock"})


def test_inverted_source_cidr_is_refused_as_envoy_cannot_render_it(
    admin: httpx.Client, org: str
) -> None:
    base = f"/v2/organizations/{org}/clusters"
    ok(admin.post(base, json={"name": "c1", "cluster": {}}))
    rule = {"clientSelectors": [{"sourceCIDR": {"value": "10.0.0.0/8", "invert": True}}]}
    policy = {**TRAFFIC_POLICY, "spec": {**TRAFFIC_POLICY["spec"]}}
    policy["spec"]["rateLimit"] = {
        "type": "Global",
        "global": {"rules": [{**rule, "limit": {"requests": 1, "unit": "Second"}}]},
    }
    body = err(
        admin.post(
            f"{base}/c1/backendtrafficpolicies",
            json={"name": "default.p", "backendTrafficPolicy": policy},
        ),
        400,
    )
    assert "invert is not supported for sourceCIDR" in body["message"]


def test_each_route_is_checked_by_its_own_groups_server_only() -> None:
    """Pure renderer: two ext_authz servers, a DISABLED setting, two policies on one route."""
    doc = {**TRAFFIC_POLICY, "metadata": {"namespace": "shop", "name": "a"}}
    first = BackendTrafficPolicy.model_validate(doc)
    second = BackendTrafficPolicy.model_validate(
        {**doc, "metadata": {"namespace": "shop", "name": "b"}}
    )
    settings = (
        envoy_config.ExtAuthzRoute(
            "s/one", "g/one", ("shop",), "grpc://one:9191", "w.one.jwt", include_headers=("x-one",)
        ),
        envoy_config.ExtAuthzRoute("s/two", "g/two", ("*",), "grpc://two:9191", None),
        envoy_config.ExtAuthzRoute(
            "s/off", "g/off", ("open",), "", None, disabled=True, include_headers=("x-off",)
        ),
    )
    config = envoy_config.render(
        envoy_config.EnvoyConfigInput(
            "organizations/o/clusters/east",
            "east",
            (("p/a", first), ("p/b", second)),
            settings,
        )
    )
    assert_envoy_accepts(config)
    filters = [f["name"] for f in config["httpFilters"]]
    one, two = "envoy.filters.http.ext_authz/one:9191", "envoy.filters.http.ext_authz/two:9191"
    assert filters == [one, two, "envoy.filters.http.ratelimit"]
    per_route = {}
    for entry in config["routes"]:
        if "setting" in entry:
            route = parse(
                {"match": {"prefix": "/"}, "typedPerFilterConfig": entry["typedPerFilterConfig"]},
                route_components_pb2.Route(),
            )
            per_route[entry["setting"]] = {
                name: unpack(any_config, ext_authz_pb2.ExtAuthzPerRoute())
                for name, any_config in route.typed_per_filter_config.items()
            }
    assert (
        per_route["s/one"][one].check_settings.context_extensions[POLICY_CONTEXT_KEY] == "w.one.jwt"
    )
    assert per_route["s/one"][two].disabled
    headers = {
        f["name"]: [m.exact for m in parse_typed(f["typedConfig"], ext_authz_pb2.ExtAuthz())
                    .allowed_headers.patterns]
        for f in config["httpFilters"][:2]
    }  # fmt: skip
    # "two" names no policy and no headers: it may be anyone's server, so every header.
    assert headers == {one: [*sorted(CHECK_HEADERS), "x-one"], two: []}
    assert per_route["s/two"][one].disabled
    assert not per_route["s/two"][two].disabled
    assert dict(per_route["s/two"][two].check_settings.context_extensions) == {}
    assert all(c.disabled for c in per_route["s/off"].values())
    assert config["warnings"] == [
        "2 BackendTrafficPolicies target httproute/shop/web; an Envoy route takes one "
        "RateLimitPerRoute, so only one of them can be applied there"
    ]


def test_a_policy_targeting_a_missing_route_is_accepted_and_warned_about(
    admin: httpx.Client, cluster: str
) -> None:
    """Accepted (201: the route may come next), but the cluster's status, the
    policy's status and envoyconfig name the policy and the missing route, until
    the route exists."""
    policy = f"{cluster}/backendtrafficpolicies/shop.web-limits"
    expected = {
        "object": policy.removeprefix("/v2/"),
        "kind": "BackendTrafficPolicy",
        "field": "spec.targetRef",
        "targetKind": "HTTPRoute",
        "targetNamespace": "shop",
        "targetName": "web",
    }
    (warning,) = ok(admin.get(f"{cluster}/status"))["warnings"]
    assert {k: warning[k] for k in expected} == expected
    assert "which does not exist" in warning["message"]
    assert ok(admin.get(f"{policy}/status"))["warnings"] == [warning]
    assert get_envoyconfig(admin, cluster)["warnings"] == [warning["message"]]

    route = {"rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}
    ok(admin.post(f"{cluster}/httproutes", json={"name": "shop.web", "httpRoute": {"spec": route}}))
    assert "warnings" not in ok(admin.get(f"{cluster}/status"))
    assert "warnings" not in ok(admin.get(f"{policy}/status"))
    assert get_envoyconfig(admin, cluster)["warnings"] == []


def test_gateway_knobs_render_into_the_filters_and_circuit_breakers(
    admin: httpx.Client, cluster: str
) -> None:
    """Unset: the explicit defaults (100 ms rate-limit timeout, not Envoy's 20 ms;
    ext_authz 200 ms, closed; no circuit breakers). Set over REST: rendered."""
    config = get_envoyconfig(admin, cluster)
    ext = parse_typed(_filter(config, "ext_authz"), ext_authz_pb2.ExtAuthz())
    rl = parse_typed(_filter(config, "ratelimit"), rate_limit_pb2.RateLimit())
    assert (ext.grpc_service.timeout.ToMilliseconds(), ext.failure_mode_allow) == (200, False)
    assert (rl.timeout.ToMilliseconds(), rl.failure_mode_deny) == (100, True)
    assert config["circuitBreakers"] is None
    before = ok(admin.get(f"{cluster}/status"))["desiredVersions"]

    current = ok(admin.get(cluster))
    knobs = {
        "rateLimit": {**current["rateLimit"], "timeout": "250ms"},
        "extAuthz": {"timeout": "50ms", "failureModeAllow": True},
        "circuitBreakers": {"maxPendingRequests": 1, "maxRequests": 2},
    }
    ok(admin.put(cluster, json={**current, **knobs}))
    config = get_envoyconfig(admin, cluster)
    ext = parse_typed(_filter(config, "ext_authz"), ext_authz_pb2.ExtAuthz())
    rl = parse_typed(_filter(config, "ratelimit"), rate_limit_pb2.RateLimit())
    assert (ext.grpc_service.timeout.ToMilliseconds(), ext.failure_mode_allow) == (50, True)
    assert ext.status_on_error.code == 503
    assert (rl.timeout.ToMilliseconds(), rl.failure_mode_deny) == (250, True)
    assert config["circuitBreakers"] == {
        "thresholds": [{"priority": "DEFAULT", "maxPendingRequests": 1, "maxRequests": 2}]
    }
    upstream = next(
        c
        for c in parse_bootstrap(envoy_config_bootstrap(config)).static_resources.clusters
        if c.name == "upstream"
    )
    (thresholds,) = upstream.circuit_breakers.thresholds
    assert (thresholds.max_pending_requests.value, thresholds.max_requests.value) == (1, 2)
    # The timeouts are the proxies': the ratelimit and extauthz snapshots do not
    # change, the gateways' and the sidecars' configuration (ADS) does (sidecars
    # call ext_authz with the cluster's timeout and failure mode too).
    after = ok(admin.get(f"{cluster}/status"))["desiredVersions"]
    for proxy in ("gateway", "sidecar"):
        assert after[proxy] != before.pop(proxy)
    assert {k: after[k] for k in before} == before

    current = ok(admin.get(cluster))
    ok(admin.put(cluster, json={**current, "rateLimit": {"failureMode": "allow"}}))
    config = get_envoyconfig(admin, cluster)
    rl = parse_typed(_filter(config, "ratelimit"), rate_limit_pb2.RateLimit())
    assert (rl.timeout.ToMilliseconds(), rl.failure_mode_deny) == (100, False)  # fail open


def test_every_test_that_gets_envoyconfig_has_envoy_validate_it() -> None:
    """A 200 from ``/envoyconfig`` in any test goes through ``get_envoyconfig``
    (or, for YAML, ``assert_envoy_accepts``), so a render Envoy rejects fails
    the suite; only error answers (``err(...)``) are read directly."""
    tests_dir = Path(__file__).resolve().parents[1]
    call = re.compile(r"""\.get\(\s*f?["'][^"']*/envoyconfig["']""")
    unchecked = []
    for path in sorted(tests_dir.rglob("*.py")):
        if path == tests_dir / "support" / "envoy.py":
            continue
        text = path.read_text()
        for match in call.finditer(text):
            line_start = text.rfind("\n", 0, match.start()) + 1
            line = text[line_start : text.find("\n", match.end())]
            if "err(" in line:
                continue
            after = text[match.end() : match.end() + 400]
            if '"format": "yaml"' in line and "assert_envoy_accepts(" in after:
                continue
            unchecked.append(f"{path.relative_to(tests_dir)}: {line.strip()}")
    assert unchecked == []
