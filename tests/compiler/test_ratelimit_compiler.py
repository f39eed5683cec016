"""BackendTrafficPolicy → rate-limit descriptor tree and Envoy route actions."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from envoy.extensions.filters.http.ratelimit.v3 import rate_limit_pb2
from google.protobuf import json_format
from pydantic import ValidationError

from mgmt_api.compiler.ratelimit import compile_policy, render_rls_files, route_rate_limits
from mgmt_api.compiler.traffic_policy import BackendTrafficPolicy
from ratelimit.config import parse_domain


def _policy(*rules: dict[str, Any], name: str = "api-limits") -> BackendTrafficPolicy:
    return BackendTrafficPolicy.model_validate(
        {
            "apiVersion": "gateway.envoyproxy.io/v1alpha1",
            "kind": "BackendTrafficPolicy",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {
                "targetRef": {
                    "group": "gateway.networking.k8s.io",
                    "kind": "HTTPRoute",
                    "name": "web",
                },
                "rateLimit": {"type": "Global", "global": {"rules": list(rules)}},
            },
        }
    )


def test_a_rule_without_selectors_limits_the_whole_route() -> None:
    doc = compile_policy("east", _policy({"limit": {"requests": 3, "unit": "Minute"}}))
    assert doc == {
        "domain": "east/shop/api-limits",
        "descriptors": [
            {
                "key": "httproute/shop/web",
                "value": "httproute/shop/web",
                "descriptors": [
                    {
                        "key": "rule-0-match--1",
                        "value": "rule-0-match--1",
                        "rate_limit": {"unit": "MINUTE", "requests_per_unit": 3},
                    }
                ],
            }
        ],
    }


def test_unit_multiplier_compiles_beside_the_unit_and_loads_as_that_window() -> None:
    limit = {"requests": 5, "unit": "Second", "unitMultiplier": 30}
    doc = compile_policy("east", _policy({"limit": limit}))
    leaf = doc["descriptors"][0]["descriptors"][0]
    assert leaf["rate_limit"] == {"unit": "SECOND", "requests_per_unit": 5, "unit_multiplier": 30}
    loaded = parse_domain(yaml.safe_dump(doc), "compiled")
    route = doc["descriptors"][0]["key"]
    node = loaded.root.exact[(route, route)].children.exact[(leaf["key"], leaf["value"])]
    assert node.limit is not None and node.limit.window_seconds == 30
    assert not node.limit.sliding


def test_sliding_window_rules_compile_to_the_services_algorithm() -> None:
    rules = [
        {"limit": {"requests": 5, "unit": "Minute"}, "algorithm": "SlidingWindow"},
        {"limit": {"requests": 5, "unit": "Minute"}, "algorithm": "FixedWindow"},
    ]
    doc = compile_policy("east", _policy(*rules))
    leaves = doc["descriptors"][0]["descriptors"]
    assert [leaf["rate_limit"].get("algorithm") for leaf in leaves] == ["sliding_window", None]
    loaded = parse_domain(yaml.safe_dump(doc), "compiled")
    route = doc["descriptors"][0]["key"]
    children = loaded.root.exact[(route, route)].children.exact
    limits = [children[(leaf["key"], leaf["value"])].limit for leaf in leaves]
    assert [limit.sliding for limit in limits if limit] == [True, False]


def test_header_and_cidr_selectors_become_one_chain_with_the_limit_at_the_leaf() -> None:
    rule = {
        "clientSelectors": [
            {
                "headers": [
                    {"name": "X-User-Id", "value": "one"},
                    {"name": "x-org", "type": "Distinct"},
                ],
                "sourceCIDR": {"type": "Distinct", "value": "10.0.0.0/8"},
            }
        ],
        "limit": {"requests": 5, "unit": "Second"},
        "shadowMode": True,
    }
    chain = compile_policy("east", _policy(rule))["descriptors"][0]["descriptors"][0]
    flat = []
    node = chain
    while True:
        flat.append((node["key"], node.get("value"), node.get("shadow_mode")))
        if "descriptors" not in node:
            break
        node = node["descriptors"][0]
    assert flat == [
        ("rule-0-match-0", "rule-0-match-0", True),
        ("rule-0-match-1", None, True),
        ("masked_remote_address", "10.0.0.0/8", True),
        ("remote_address", None, True),
    ]
    assert node["rate_limit"] == {"unit": "SECOND", "requests_per_unit": 5}


def test_two_rules_are_siblings_so_either_can_deny() -> None:
    doc = compile_policy(
        "east",
        _policy(
            {"limit": {"requests": 5, "unit": "Minute"}},
            {"limit": {"requests": 2, "unit": "Second"}},
        ),
    )
    keys = [c["key"] for c in doc["descriptors"][0]["descriptors"]]
    assert keys == ["rule-0-match--1", "rule-1-match--1"]


def test_route_actions_parse_into_envoys_proto_and_produce_the_same_keys() -> None:
    rule = {
        "clientSelectors": [
            {
                "headers": [
                    {"name": "x-user", "value": "^a.*", "type": "RegularExpression", "invert": True}
                ]
            }
        ],
        "limit": {"requests": 1, "unit": "Hour"},
        "cost": {"request": 2},
    }
    policy = _policy(rule, {"limit": {"requests": 9, "unit": "Day"}})
    per_route = route_rate_limits("east", policy)
    message = rate_limit_pb2.RateLimitPerRoute()
    json_format.ParseDict({k: v for k, v in per_route.items() if k != "@type"}, message)
    assert message.domain == "east/shop/api-limits"
    first, second = message.rate_limits
    assert first.hits_addend.number.value == 2
    assert first.actions[0].generic_key.descriptor_key == "httproute/shop/web"
    match = first.actions[1].header_value_match
    assert (match.descriptor_key, match.expect_match.value) == ("rule-0-match-0", False)
    assert second.actions[1].generic_key.descriptor_key == "rule-1-match--1"


def test_rls_files_are_valid_yaml_one_per_policy_in_stable_order() -> None:
    files = render_rls_files(
        "east",
        [
            _policy({"limit": {"requests": 1, "unit": "Second"}}, name="b"),
            _policy({"limit": {"requests": 1, "unit": "Second"}}, name="a"),
        ],
    )
    assert list(files) == ["shop--a.yaml", "shop--b.yaml"]
    assert yaml.safe_load(files["shop--a.yaml"])["domain"] == "east/shop/a"


@pytest.mark.parametrize(
    ("rule", "field"),
    [
        ({"limit": {"requests": -1, "unit": "Second"}}, "requests"),
        ({"limit": {"requests": 1, "unit": "Week"}}, "unit"),
        ({"limit": {"requests": 1, "unit": "Second"}, "algorithm": "TokenBucket"}, "algorithm"),
        ({"limit": {"requests": 1, "unit": "Second", "unitMultiplier": 0}}, "unitMultiplier"),
        ({"limit": {"requests": 1, "unit": "Minute", "unitMultiplier": "5"}}, "unitMultiplier"),
        (
            {"limit": {"requests": 1, "unit": "Day", "unitMultiplier": 366}},
            "makes a window longer than 365 days; at most 365 with unit Day",
        ),
        ({"limit": {"requests": 1, "unit": "Second"}, "burst": 3}, "burst"),
        ({"limit": {"requests": 1, "unit": "Second"}, "clientSelectors": [{}]}, "clientSelectors"),
        (
            {
                "limit": {"requests": 1, "unit": "Second"},
                "clientSelectors": [{"headers": [{"name": "x", "type": "Exact"}]}],
            },
            "headers",
        ),
        (
            {
                "limit": {"requests": 1, "unit": "Second"},
                "clientSelectors": [{"sourceCIDR": {"value": "nope"}}],
            },
            "sourceCIDR",
        ),
    ],
)
def test_invalid_rules_are_rejected_naming_the_field(rule: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        _policy(rule)
    assert field in str(info.value)


def test_local_rate_limits_are_rejected() -> None:
    with pytest.raises(ValidationError) as info:
        BackendTrafficPolicy.model_validate(
            {
                "metadata": {"name": "x"},
                "spec": {
                    "targetRef": {"name": "web"},
                    "rateLimit": {
                        "type": "Local",
                        "global": {"rules": [{"limit": {"requests": 1, "unit": "Second"}}]},
                    },
                },
            }
        )
    assert "rateLimit.type" in str(info.value)
