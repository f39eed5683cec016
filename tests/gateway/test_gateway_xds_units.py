"""The pure parts of the gateway's configuration: node parsing, bootstrap, xDS compile.

Table tests of :mod:`meshplane.gateway_contract` and
:mod:`mgmt_api.compiler.gateway_xds`; every compiled configuration and
every bootstrap is also handed to the real Envoy (``envoy --mode validate``),
so what is asserted here is also what Envoy accepts.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm

from meshplane import gateway_contract as gc
from mgmt_api.compiler import envoy_config, gateway_xds, local_jwt
from mgmt_api.compiler.http_route import Backend, HTTPRoute
from mgmt_api.compiler.traffic_policy import BackendTrafficPolicy
from tests.support.certs import CertificateAuthority
from tests.support.envoy import validate

NODE = gc.GatewayNode("o", "c1", "gw-1", "127.0.0.1", 10000)


# ---- the node ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("node_id", "cluster", "metadata", "expected"),
    [
        ("gw", "o/c", {}, gc.GatewayNode("o", "c", "gw")),
        (
            "gw",
            "o/c",
            {
                gc.LISTENER_KEY: {"address": "::", "port": 8443.0},
                gc.GATEWAY_NAME_KEY: "edge",
                gc.RATELIMIT_SERVICE_KEY: "grpc://10.0.0.1:8081",
            },
            gc.GatewayNode("o", "c", "gw", "::", 8443, "edge", "grpc://10.0.0.1:8081"),
        ),
        (  # the services in the gateway's pod, on a Unix socket
            "gw",
            "o/c",
            {gc.RATELIMIT_SERVICE_KEY: "unix:///var/run/meshplane/ratelimit.sock"},
            gc.GatewayNode(
                "o", "c", "gw", ratelimit_service="unix:///var/run/meshplane/ratelimit.sock"
            ),
        ),
    ],
)
def test_nodes_parse(
    node_id: str, cluster: str, metadata: dict[str, Any], expected: gc.GatewayNode
) -> None:
    assert gc.parse_node(node_id, cluster, metadata) == expected


@pytest.mark.parametrize(
    ("node_id", "cluster", "metadata", "message"),
    [
        ("gw", "o", {}, "ORGANIZATION/CLUSTER"),
        ("gw", "o/c/x", {}, "ORGANIZATION/CLUSTER"),
        ("gw", "/c", {}, "ORGANIZATION/CLUSTER"),
        ("", "o/c", {}, "node.id"),
        ("gw", "o/c", {gc.LISTENER_KEY: "0.0.0.0:80"}, "{address, port}"),
        ("gw", "o/c", {gc.LISTENER_KEY: {"port": 0}}, "1-65535"),
        ("gw", "o/c", {gc.LISTENER_KEY: {"port": 80.5}}, "1-65535"),
        ("gw", "o/c", {gc.LISTENER_KEY: {"address": "host", "port": 80}}, "IP address"),
        ("gw", "o/c", {gc.GATEWAY_NAME_KEY: ""}, "must be a name"),
        ("gw", "o/c", {gc.RATELIMIT_SERVICE_KEY: "ratelimit:8081"}, "grpc://"),
        ("gw", "o/c", {gc.RATELIMIT_SERVICE_KEY: "unix:rl.sock"}, "unix:///ABSOLUTE/PATH"),
        ("gw", "o/c", {gc.RATELIMIT_SERVICE_KEY: "unix://host/rl.sock"}, "unix:///"),
        ("gw", "o/c", {gc.RATELIMIT_SERVICE_KEY: "unix:///" + "x" * 120}, "107 bytes"),
        ("gw", "o/c", {gc.RATELIMIT_SERVICE_KEY: "grpc://rl:1/path"}, "grpc://"),
    ],
)
def test_bad_nodes_are_refused_naming_what(
    node_id: str, cluster: str, metadata: dict[str, Any], message: str
) -> None:
    with pytest.raises(gc.NodeError, match=message.replace("{", r"\{").replace("}", r"\}")):
        gc.parse_node(node_id, cluster, metadata)


# ---- the bootstrap -------------------------------------------------------------------


def test_a_plaintext_bootstrap_is_what_envoy_accepts() -> None:
    boot = gc.bootstrap(NODE, ads="grpc://mgmt-api.example:8444", token="t0ken")
    assert boot["node"] == {"id": "gw-1", "cluster": "o/c1", "metadata": NODE.metadata()}
    service = boot["dynamic_resources"]["ads_config"]["grpc_services"][0]
    assert service["initial_metadata"] == [{"key": "authorization", "value": "Bearer t0ken"}]
    assert boot["static_resources"]["clusters"][0]["type"] == "STRICT_DNS"
    result = validate(boot)
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_tls_bootstrap_checks_the_server_and_can_present_a_client_certificate(
    tmp_path: Path,
) -> None:
    ca = CertificateAuthority(tmp_path)
    client = ca.issue("gateway", client=True)
    boot = gc.bootstrap(
        NODE,
        ads="grpcs://127.0.0.1:8444",
        token="t",
        ca_file=str(ca.path),
        cert_file=str(client.cert),
        key_file=str(client.key),
    )
    cluster = boot["static_resources"]["clusters"][0]
    tls = cluster["transport_socket"]["typed_config"]
    assert cluster["type"] == "STATIC"
    assert tls["common_tls_context"]["validation_context"] == {
        "trusted_ca": {"filename": str(ca.path)},
        "match_typed_subject_alt_names": [
            {"san_type": "IP_ADDRESS", "matcher": {"exact": "127.0.0.1"}}
        ],
    }
    result = validate(boot)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.parametrize(
    ("ads", "kwargs", "message"),
    [
        ("http://mgmt:8444", {}, "grpc://HOST:PORT"),
        ("grpc://mgmt", {}, "grpc://HOST:PORT"),
        ("grpcs://mgmt:8444", {}, "CA file"),
        ("grpcs://mgmt:8444", {"ca_file": "ca.pem", "cert_file": "c.pem"}, "both"),
    ],
)
def test_bad_bootstrap_arguments_are_refused(
    ads: str, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(gc.NodeError, match=message):
        gc.bootstrap(NODE, ads=ads, token="t", **kwargs)


# ---- the compiled configuration --------------------------------------------------------


def route(name: str, *rules: dict[str, Any], **spec: Any) -> tuple[str, HTTPRoute]:
    namespace, short = name.split(".")
    doc = {
        "metadata": {"namespace": namespace, "name": short},
        "spec": {"rules": list(rules), **spec},
    }
    return f"organizations/o/clusters/c1/httproutes/{name}", HTTPRoute.model_validate(doc)


def rule(
    *paths: str, backends: tuple[str, ...] = ("app",), exact: bool = False, **ref: Any
) -> dict[str, Any]:
    kind = "Exact" if exact else "PathPrefix"
    refs = [
        {"group": "gateway.envoyproxy.io", "kind": "Backend", "name": b, **ref} for b in backends
    ]
    return {"matches": [{"path": {"type": kind, "value": p}} for p in paths], "backendRefs": refs}


def backend(name: str, port: int = 8000) -> tuple[str, Backend]:
    namespace, short = name.split(".")
    doc = {
        "metadata": {"namespace": namespace, "name": short},
        "spec": {"endpoints": [{"ip": {"address": "127.0.0.1", "port": port}}]},
    }
    return f"organizations/o/clusters/c1/backends/{name}", Backend.model_validate(doc)


def limit(
    name: str, target: str, requests: int = 3, kind: str = "HTTPRoute"
) -> tuple[str, BackendTrafficPolicy]:
    namespace, short = name.split(".")
    doc = {
        "metadata": {"namespace": namespace, "name": short},
        "spec": {
            "targetRef": {"kind": kind, "name": target},
            "rateLimit": {
                "type": "Global",
                "global": {"rules": [{"limit": {"requests": requests, "unit": "Minute"}}]},
            },
        },
    }
    return (
        f"organizations/o/clusters/c1/backendtrafficpolicies/{name}",
        BackendTrafficPolicy.model_validate(doc),
    )


def authz(
    namespaces: tuple[str, ...], setting: str = "s", uri: str = "grpc://127.0.0.1:9191"
) -> envoy_config.ExtAuthzRoute:
    return envoy_config.ExtAuthzRoute(
        setting=f"organizations/o/tenants/t/workspaces/w/securitygroups/g/settings/{setting}",
        group="organizations/o/tenants/t/workspaces/w/securitygroups/g",
        namespaces=namespaces,
        uri=uri,
        policy="t.w.g.jwt",
    )


def gateway_input(
    routes: list[tuple[str, HTTPRoute]],
    backends: list[tuple[str, Backend]] | None = None,
    limits: list[tuple[str, BackendTrafficPolicy]] | None = None,
    ext_authz: list[envoy_config.ExtAuthzRoute] | None = None,
) -> gateway_xds.GatewayInput:
    policies = envoy_config.EnvoyConfigInput(
        cluster_fqn="organizations/o/clusters/c1",
        cluster="c1",
        traffic_policies=tuple(limits or ()),
        ext_authz=tuple(ext_authz or ()),
    )
    return gateway_xds.GatewayInput(
        policies,
        tuple(routes),
        tuple(backends if backends is not None else [backend("default.app")]),
    )


def static_bootstrap(resources: gateway_xds.GatewayResources) -> dict[str, Any]:
    """The compiled resources as one static Envoy config (RDS inlined), for validation."""
    listener = copy.deepcopy(resources.listeners[0])
    manager = listener["filterChains"][0]["filters"][0]["typedConfig"]
    del manager["rds"]
    manager["routeConfig"] = resources.route_configurations[0]
    return {
        "admin": {"address": {"socketAddress": {"address": "127.0.0.1", "portValue": 0}}},
        "staticResources": {"listeners": [listener], "clusters": list(resources.clusters)},
    }


def compiled(
    inp: gateway_xds.GatewayInput, node: gc.GatewayNode = NODE
) -> gateway_xds.GatewayResources:
    resources = gateway_xds.compile_gateway(inp, node)
    result = validate(static_bootstrap(resources))
    assert result.returncode == 0, result.stderr[-3000:]
    return resources


def routes_of(resources: gateway_xds.GatewayResources, host: str = "*") -> list[dict[str, Any]]:
    vhost = next(v for v in resources.route_configurations[0]["virtualHosts"] if v["name"] == host)
    return list(vhost["routes"])


def test_routes_follow_gateway_api_precedence() -> None:
    inp = gateway_input(
        [
            route("default.a", rule("/", "/api")),
            route("default.b", rule("/api/v1")),
            route("default.c", rule("/api", exact=True)),
        ]
    )
    matches = [r["match"] for r in routes_of(compiled(inp))]
    assert matches == [{"path": "/api"}, {"prefix": "/api/v1"}, {"prefix": "/api"}, {"prefix": "/"}]


def test_hostnames_make_virtual_hosts_and_the_rest_is_any_host() -> None:
    inp = gateway_input(
        [
            route("default.a", rule("/"), hostnames=["shop.example.com", "*.example.org"]),
            route("default.b", rule("/b")),
        ]
    )
    vhosts = compiled(inp).route_configurations[0]["virtualHosts"]
    assert [(v["name"], v["domains"]) for v in vhosts] == [
        ("*.example.org", ["*.example.org"]),
        ("shop.example.com", ["shop.example.com"]),
        ("*", ["*"]),
    ]


def test_parent_refs_attach_a_route_to_the_gateways_it_names() -> None:
    inp = gateway_input(
        [
            route("default.edge", rule("/edge"), parentRefs=[{"name": "edge"}]),
            route("default.all", rule("/all")),
        ]
    )
    default = [r["match"]["prefix"] for r in routes_of(compiled(inp))]
    edge = [
        r["match"]["prefix"]
        for r in routes_of(compiled(inp, gc.GatewayNode("o", "c1", "e", gateway_name="edge")))
    ]
    assert default == ["/all"]
    assert edge == ["/edge", "/all"]


def test_a_policy_limits_the_route_it_targets_in_its_namespace_only() -> None:
    inp = gateway_input(
        [
            route("default.web", rule("/web")),
            route("other.web", rule("/other", backends=("app",), namespace="default")),
        ],
        limits=[limit("default.web-limit", "web")],
    )
    resources = compiled(inp)
    by_path = {r["match"]["prefix"]: r for r in routes_of(resources)}
    limited = by_path["/web"]["typedPerFilterConfig"][envoy_config.RATELIMIT_FILTER]
    assert limited["domain"] == "c1/default/web-limit"
    assert "typedPerFilterConfig" not in by_path["/other"]
    filters = resources.listeners[0]["filterChains"][0]["filters"][0]["typedConfig"]["httpFilters"]
    assert [f["name"] for f in filters] == [
        envoy_config.RATELIMIT_FILTER,
        gateway_xds.ROUTER_FILTER,
    ]


def test_a_gateway_policy_limits_the_routes_without_their_own() -> None:
    inp = gateway_input(
        [route("default.web", rule("/web")), route("default.api", rule("/api"))],
        limits=[
            limit("default.edge", "gateway", kind="Gateway", requests=9),
            limit("default.api", "api"),
        ],
    )
    by_path = {r["match"]["prefix"]: r for r in routes_of(compiled(inp))}

    def domain(path: str) -> object:
        return by_path[path]["typedPerFilterConfig"][envoy_config.RATELIMIT_FILTER]["domain"]

    assert domain("/web") == "c1/default/edge"
    assert domain("/api") == "c1/default/api"


def test_ext_authz_checks_the_namespaces_its_group_selects_and_no_other() -> None:
    inp = gateway_input(
        [
            route("secure.web", rule("/web", namespace="default")),
            route("default.open", rule("/open")),
        ],
        ext_authz=[authz(("secure",))],
    )
    by_path = {r["match"]["prefix"]: r["typedPerFilterConfig"] for r in routes_of(compiled(inp))}
    checked = by_path["/web"][envoy_config.EXT_AUTHZ_FILTER]
    assert checked["checkSettings"]["contextExtensions"] == {"meshplane.policy": "t.w.g.jwt"}
    assert by_path["/open"][envoy_config.EXT_AUTHZ_FILTER]["disabled"] is True


def test_local_jwt_filters_are_disabled_unless_a_route_enables_them() -> None:
    """Pass-through jwt_authn/rbac still cost CPU per request: they are disabled
    on the listener and enabled by the routes under local rules; the listener
    is the same with or without such a route (a listener change would not
    reach open connections)."""
    public = ECAlgorithm.to_jwk(ec.generate_private_key(ec.SECP256R1()).public_key(), as_dict=True)
    jwks = json.dumps({"keys": [{**public, "kid": "k1"}]})
    local = {
        "rules": [{"from": [{"jwt": {"iss": "https://idp"}}]}],
        "keys": {"jwks": {"value": jwks}},
    }
    setting = dataclasses.replace(authz(("local",), "l"), local=local)
    plain = [route("default.open", rule("/open"))]
    used = [*plain, route("local.api", rule("/api", namespace="default"))]
    without = compiled(gateway_input(plain, ext_authz=[setting, authz(("secure",))]))
    with_local = compiled(gateway_input(used, ext_authz=[setting, authz(("secure",))]))
    assert without.listeners == with_local.listeners
    manager = with_local.listeners[0]["filterChains"][0]["filters"][0]["typedConfig"]
    disabled = {f["name"] for f in manager["httpFilters"] if f.get("disabled")}
    assert disabled == {local_jwt.JWT_AUTHN_FILTER, local_jwt.RBAC_FILTER}
    by_path = {r["match"]["prefix"]: r["typedPerFilterConfig"] for r in routes_of(with_local)}
    for name in disabled:
        enabling = by_path["/api"][name]
        assert enabling["@type"].endswith("envoy.config.route.v3.FilterConfig")
        assert not enabling.get("disabled")
        assert name not in by_path["/open"]


def test_two_settings_for_one_namespace_warn_and_the_first_applies() -> None:
    inp = gateway_input(
        [route("secure.web", rule("/web", namespace="default"))],
        ext_authz=[authz(("*",), "a"), authz(("secure",), "b", "grpc://127.0.0.1:9292")],
    )
    resources = compiled(inp)
    per_filter = routes_of(resources)[0]["typedPerFilterConfig"]
    assert per_filter["envoy.filters.http.ext_authz/127.0.0.1:9191"]["checkSettings"]
    assert per_filter["envoy.filters.http.ext_authz/127.0.0.1:9292"]["disabled"] is True
    assert any("2 SecuritySettings select namespace 'secure'" in w for w in resources.warnings)


def test_services_on_unix_sockets_are_reached_through_pipe_clusters() -> None:
    """The "sidecar services" placement: ratelimit and extauthz in the gateway's pod."""
    inp = gateway_input(
        [route("secure.web", rule("/web", namespace="default"))],
        limits=[limit("default.web-limit", "web")],
        ext_authz=[
            authz(("*",), "a", "unix:///run/mp/extauthz.sock"),
            authz(("secure",), "b", "unix:///run/mp/other.sock"),
        ],
    )
    node = dataclasses.replace(NODE, ratelimit_service="unix:///run/mp/ratelimit.sock")
    clusters = {c["name"]: c for c in compiled(inp, node).clusters}
    pipes = {
        name: (c["type"], c["loadAssignment"]["endpoints"][0]["lbEndpoints"][0]["endpoint"])
        for name, c in clusters.items()
        if name.startswith(("extauthz", envoy_config.RATELIMIT_CLUSTER))
    }
    assert pipes == {
        envoy_config.RATELIMIT_CLUSTER: (
            "STATIC",
            {"address": {"pipe": {"path": "/run/mp/ratelimit.sock"}}},
        ),
        "extauthz//run/mp/extauthz.sock": (
            "STATIC",
            {"address": {"pipe": {"path": "/run/mp/extauthz.sock"}}},
        ),
        "extauthz//run/mp/other.sock": (
            "STATIC",
            {"address": {"pipe": {"path": "/run/mp/other.sock"}}},
        ),
    }


def test_upstreams_backends_services_weights_and_missing_backends() -> None:
    inp = gateway_input(
        [
            route("default.split", rule("/split", backends=("app", "canary"))),
            route("default.svc", {"backendRefs": [{"name": "orders", "port": 8080}]}),
            route("default.gone", rule("/gone", backends=("missing",))),
            route(
                "default.off",
                rule("/off", backends=("app",))
                | {
                    "backendRefs": [
                        {
                            "group": "gateway.envoyproxy.io",
                            "kind": "Backend",
                            "name": "app",
                            "weight": 0,
                        }
                    ]
                },
            ),
        ],
        backends=[backend("default.app"), backend("default.canary", 8001)],
    )
    resources = compiled(inp)
    clusters = {c["name"]: c for c in resources.clusters}
    assert clusters["backend/default/app"]["type"] == "STATIC"
    service = clusters["service/default/orders/8080"]
    assert service["type"] == "STRICT_DNS"
    endpoint = service["loadAssignment"]["endpoints"][0]["lbEndpoints"][0]["endpoint"]
    assert endpoint["address"]["socketAddress"] == {
        "address": "orders.default.svc.cluster.local",
        "portValue": 8080,
    }
    by_path = {r["match"]["prefix"]: r for r in routes_of(resources)}
    assert by_path["/split"]["route"]["weightedClusters"]["clusters"] == [
        {"name": "backend/default/app", "weight": 1},
        {"name": "backend/default/canary", "weight": 1},
    ]
    assert by_path["/gone"]["route"] == {"cluster": "backend/default/missing"}
    assert "backend/default/missing" not in clusters  # the status warns (compiler.references)
    assert not any("default/missing" in w for w in resources.warnings)  # and only it
    assert by_path["/off"]["directResponse"] == {"status": 500}


def test_the_version_follows_content_not_the_gateway() -> None:
    a = gateway_input([route("default.a", rule("/"))])
    b = gateway_input([route("default.a", rule("/b"))])
    assert a.version() == gateway_input([route("default.a", rule("/"))]).version()
    assert a.version() != b.version()
    other = gc.GatewayNode("o", "c1", "gw-2", "127.0.0.1", 10001, ratelimit_service="grpc://rl:1")
    assert compiled(a, other).listeners[0]["address"]["socketAddress"]["portValue"] == 10001
