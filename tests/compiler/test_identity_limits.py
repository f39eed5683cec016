"""jwtClaims selectors: the model's bounds, the Envoy actions, which claims ext_authz
publishes, and the errors for routes no ext_authz policy checks (pure, table-tested)."""

from __future__ import annotations

from typing import Any

import pytest
from envoy.extensions.filters.http.ratelimit.v3 import rate_limit_pb2
from google.protobuf import json_format
from pydantic import ValidationError

from extauthz import contract
from mgmt_api.compiler.envoy_config import EnvoyConfigInput, ExtAuthzRoute, render
from mgmt_api.compiler.extauthz import StoredPolicy, render_file
from mgmt_api.compiler.http_route import HTTPRoute
from mgmt_api.compiler.identity_limits import compile_claim_limits
from mgmt_api.compiler.ratelimit import compile_policy, route_rate_limits
from mgmt_api.compiler.traffic_policy import BackendTrafficPolicy

LIMIT = {"requests": 2, "unit": "Hour"}


def claims_rule(*claims: dict[str, Any]) -> dict[str, Any]:
    return {"clientSelectors": [{"jwtClaims": list(claims)}], "limit": LIMIT}


def policy(
    name: str, *rules: dict[str, Any], kind: str = "HTTPRoute", target: str = "web"
) -> tuple[str, BackendTrafficPolicy]:
    namespace, short = name.split(".")
    doc = {
        "metadata": {"namespace": namespace, "name": short},
        "spec": {
            "targetRef": {"kind": kind, "name": target},
            "rateLimit": {"type": "Global", "global": {"rules": list(rules)}},
        },
    }
    fqn = f"organizations/o/clusters/c1/backendtrafficpolicies/{name}"
    return fqn, BackendTrafficPolicy.model_validate(doc)


def http_route(name: str, *gateways: str) -> HTTPRoute:
    namespace, short = name.split(".")
    spec: dict[str, Any] = {
        "rules": [
            {"backendRefs": [{"group": "gateway.envoyproxy.io", "kind": "Backend", "name": "app"}]}
        ]
    }
    if gateways:
        spec["parentRefs"] = [{"name": g} for g in gateways]
    return HTTPRoute.model_validate(
        {"metadata": {"namespace": namespace, "name": short}, "spec": spec}
    )


def setting(
    name: str, *namespaces: str, policy: str | None = "jwt", disabled: bool = False
) -> ExtAuthzRoute:
    return ExtAuthzRoute(name, "g", namespaces, "grpc://extauthz:9001", policy, disabled)


SUB = {"name": "sub", "type": "Distinct"}
ACME = {"name": "org", "type": "Exact", "value": "acme"}


def test_claims_become_metadata_actions_envoy_accepts_and_matching_tree_nodes() -> None:
    _, p = policy("shop.limits", claims_rule(SUB, ACME))
    per_route = route_rate_limits("east", p)
    message = rate_limit_pb2.RateLimitPerRoute()  # Envoy's own schema accepts it
    json_format.ParseDict({k: v for k, v in per_route.items() if k != "@type"}, message)
    read = message.rate_limits[0].actions[1].metadata
    assert (read.source, read.skip_if_absent, read.default_value) == (read.DYNAMIC, False, "")
    actions = per_route["rateLimits"][0]["actions"]
    assert actions[1] == {
        "metadata": {
            "descriptorKey": "rule-0-match-0",
            "metadataKey": {
                "key": "envoy.filters.http.ext_authz",
                "path": [{"key": "meshplane.claims"}, {"key": "sub"}],
            },
            "source": "DYNAMIC",
            "skipIfAbsent": False,  # and no default: an absent claim sends no descriptor
        }
    }
    assert actions[2]["metadata"]["descriptorKey"] == "rule-0-match-1"
    chain = compile_policy("east", p)["descriptors"][0]["descriptors"][0]
    assert chain["key"] == "rule-0-match-0" and "value" not in chain  # one bucket per sub
    assert chain["descriptors"][0] == {
        "key": "rule-0-match-1",
        "value": "acme",  # that value only
        "rate_limit": {"unit": "HOUR", "requests_per_unit": 2},
    }


@pytest.mark.parametrize(
    ("claim", "message"),
    [
        ({"name": "sub", "type": "Distinct", "value": "x"}, "value must be empty"),
        ({"name": "org", "type": "Exact"}, "value is required"),
        ({"name": "org", "value": ""}, "at least 1 character"),
        ({"name": "a b", "type": "Distinct"}, "string_pattern_mismatch"),
        ({"name": "c" * 65, "type": "Distinct"}, "at most 64"),
        ({"name": "org", "value": "é" * 129}, "longer than 256 bytes"),
        ({"name": "sub", "type": "Regex", "value": "x"}, "'Exact' or 'Distinct'"),
        ({"name": "sub", "type": "Distinct", "header": "x-user"}, "Extra inputs"),
    ],
)
def test_bad_claim_selectors_are_refused_naming_the_field(
    claim: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError) as info:
        policy("shop.limits", claims_rule(claim))
    text = str(info.value)
    assert "jwtClaims" in text and message in text, text


def test_a_policy_selects_on_at_most_as_many_claims_as_ext_authz_publishes() -> None:
    rules = [claims_rule({"name": f"c{i}", "type": "Distinct"}) for i in range(9)]
    with pytest.raises(ValidationError, match="at most 8 can be published"):
        policy("shop.limits", *rules)


def test_each_ext_authz_policy_publishes_the_claims_its_routes_limits_read() -> None:
    limits = compile_claim_limits(
        [
            policy("shop.a", claims_rule(SUB), target="web"),
            policy("api.b", claims_rule(ACME), target="api"),
            policy("shop.plain", {"limit": LIMIT}, target="other"),
        ],
        [setting("s1", "shop", policy="p1"), setting("s2", "api", policy="p2")],
        [],
    )
    assert limits.published == {"p1": ("sub",), "p2": ("org",)}
    assert limits.errors == ()


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        ([], "no setting selects the namespace"),
        ([setting("s1", "api")], "another namespace"),
        ([setting("a", "shop", disabled=True), setting("b", "*")], "the first setting disables"),
        ([setting("s1", "*", policy=None)], "a setting naming no policy"),
    ],
)
def test_claims_on_a_route_no_ext_authz_policy_checks_are_an_error(
    settings: list[ExtAuthzRoute], why: str
) -> None:
    fqn, p = policy("shop.a", claims_rule(SUB), {"limit": LIMIT})
    limits = compile_claim_limits([(fqn, p)], settings, [])
    assert [(e.policy, e.route) for e in limits.errors] == [(fqn, "httproute/shop/web")], why
    assert "no ext_authz policy checks" in limits.errors[0].message
    assert "sub" not in {c for cs in limits.published.values() for c in cs}


def test_a_gateway_policy_covers_attached_routes_without_a_policy_of_their_own() -> None:
    fqn, p = policy("infra.gw", claims_rule(SUB), kind="Gateway", target="edge")
    limits = compile_claim_limits(
        [(fqn, p), policy("shop.own", {"limit": LIMIT}, target="own")],
        [setting("s1", "shop", policy="p1")],
        [
            http_route("shop.web", "edge"),
            http_route("shop.own", "edge"),  # its own policy applies instead
            http_route("open.site"),  # attached to every gateway, unchecked
            http_route("open.elsewhere", "other"),  # not on this gateway
        ],
    )
    assert limits.published == {"p1": ("sub",)}
    assert [e.route for e in limits.errors] == ["httproute/open/site"]


def test_more_claims_than_one_ext_authz_policy_publishes_is_an_error() -> None:
    policies = [
        policy(f"shop.p{i}", claims_rule({"name": f"c{i}", "type": "Distinct"}), target=f"r{i}")
        for i in range(10)
    ]
    limits = compile_claim_limits(policies, [setting("s1", "shop", policy="p1")], [])
    assert limits.published["p1"] == tuple(sorted(f"c{i}" for i in range(10)))[:8]
    assert len(limits.errors) == 1 and "at most 8" in limits.errors[0].message


def test_the_ext_authz_file_carries_the_claims_and_loads() -> None:
    spec: StoredPolicy = {
        "jwt": {"algorithms": ["HS256"], "keys": [{"hmacSecret": {"value": "s" * 32}}]}
    }
    document = render_file([("a", spec), ("b", spec)], {"a": ("org", "sub")})
    loaded = contract.parse_config(document)
    assert loaded.policies["a"].claims_to_metadata == ("org", "sub")
    assert loaded.policies["b"].claims_to_metadata == ()


def test_ext_authz_runs_before_the_rate_limit_filter() -> None:
    """Envoy runs HTTP filters in list order: a token ext_authz denies never
    reaches the rate-limit filter, and the claims are set before it reads them."""
    document = render(
        EnvoyConfigInput(
            "organizations/o/clusters/c1",
            "c1",
            (policy("shop.a", claims_rule(SUB)),),
            (setting("s1", "shop", policy="p1"),),
        )
    )
    names = [f["name"] for f in document["httpFilters"]]
    assert names == ["envoy.filters.http.ext_authz", "envoy.filters.http.ratelimit"]
