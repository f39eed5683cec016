"""BackendTrafficPolicy rules in ``mode: quota`` → Envoy's rate_limit_quota filters.

The bucket id a filter builds must resolve, through the ratelimit service's own
reader (ratelimit/quota/buckets.py), to the limit the same policy compiles into
the service's config; Envoy must accept the rendered document; rules the
filter cannot express are refused naming the field. A real gateway enforcing
it is tests/gateway/test_quota_gateways.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from mgmt_api.compiler import envoy_config, gateway_xds, quota
from mgmt_api.compiler.ratelimit import compile_policy, route_rate_limits
from mgmt_api.compiler.traffic_policy import BackendTrafficPolicy
from ratelimit.config import RateLimitConfig, parse_domain
from ratelimit.quota.buckets import bucket_limit
from tests.compiler.test_ratelimit_compiler import _policy
from tests.support.envoy import assert_envoy_accepts

QUOTA = {"limit": {"requests": 600, "unit": "Minute"}, "mode": "quota"}
EXACT = {"limit": {"requests": 5, "unit": "Second"}}


def _render(*policies: BackendTrafficPolicy, fail_closed: bool = False) -> dict[str, Any]:
    return envoy_config.render(
        envoy_config.EnvoyConfigInput(
            cluster_fqn="organizations/o/clusters/east",
            cluster="east",
            traffic_policies=tuple((f"p{i}", p) for i, p in enumerate(policies)),
            ext_authz=(),
            gateway=envoy_config.GatewaySettings(ratelimit_fail_closed=fail_closed),
        )
    )


def _settings(filter_: dict[str, Any]) -> dict[str, Any]:
    matcher = filter_["typedConfig"]["bucketMatchers"]["matcherList"]["matchers"][0]
    return matcher["onMatch"]["action"]["typedConfig"]  # type: ignore[no-any-return]


def _bucket_id(settings: dict[str, Any], headers: dict[str, str]) -> dict[str, str]:
    """The bucket id Envoy builds for a request with ``headers``."""
    out = {}
    for key, builder in settings["bucketIdBuilder"]["bucketIdBuilder"].items():
        if "stringValue" in builder:
            out[key] = builder["stringValue"]
        else:
            out[key] = headers[builder["customValue"]["typedConfig"]["headerName"]]
    return out


def test_a_quota_rule_is_one_filter_whose_bucket_resolves_to_the_compiled_limit() -> None:
    distinct = {**QUOTA, "clientSelectors": [{"headers": [{"name": "x-user", "type": "Distinct"}]}]}
    policy = _policy(EXACT, distinct)
    doc = _render(policy)
    names = [f["name"] for f in doc["httpFilters"]]
    assert names == [
        envoy_config.RATELIMIT_FILTER,
        quota.ROUTE_MARK_FILTER,
        f"{quota.QUOTA_FILTER}/shop/api-limits/1",
    ]
    config = RateLimitConfig.of(
        [parse_domain(__import__("yaml").safe_dump(compile_policy("east", policy)), "p.yaml")]
    )
    settings = _settings(doc["httpFilters"][2])
    bucket = _bucket_id(settings, {"x-user": "u1"})
    assert bucket == {
        "domain": "east/shop/api-limits",
        "0:httproute/shop/web": "httproute/shop/web",
        "1:rule-1-match-0": "u1",
    }
    limit = bucket_limit(config, bucket, "east")
    assert limit.rate == pytest.approx(10.0)  # 600 a minute
    # The exact rule stays on the per-request path; the quota one is not sent there.
    actions = route_rate_limits("east", policy)["rateLimits"]
    assert len(actions) == 1
    route = doc["routes"][0]
    assert route["modes"] == ["exact", "quota"]
    # The route marks its requests; the quota filter counts only marked ones.
    (mark,) = route["typedPerFilterConfig"][quota.ROUTE_MARK_FILTER]["requestRules"]
    assert mark["onHeaderPresent"] == {
        "metadataNamespace": "meshplane.quota",
        "key": "shop/api-limits",
        "value": "on",
    }
    predicates = doc["httpFilters"][2]["typedConfig"]["bucketMatchers"]["matcherList"]["matchers"][
        0
    ]["predicate"]["andMatcher"]["predicate"]
    assert predicates[0]["singlePredicate"]["input"]["typedConfig"]["path"] == [
        {"key": "shop/api-limits"}
    ]
    assert_envoy_accepts(doc)


@pytest.mark.parametrize(("fail_closed", "first"), [(False, "ALLOW_ALL"), (True, "DENY_ALL")])
def test_fallbacks_follow_the_cluster_failure_mode_and_the_whole_limit(
    fail_closed: bool, first: str
) -> None:
    settings = _settings(_render(_policy(QUOTA), fail_closed=fail_closed)["httpFilters"][1])
    assert settings["noAssignmentBehavior"] == {"fallbackRateLimit": {"blanketRule": first}}
    expired = settings["expiredAssignmentBehavior"]
    assert expired["fallbackRateLimit"] == {
        "tokenBucket": {"maxTokens": 600, "tokensPerFill": 600, "fillInterval": "60s"}
    }
    assert expired["expiredAssignmentBehaviorTimeout"] == f"{quota.FALLBACK_SECONDS}s"


def test_a_quota_only_policy_has_no_per_request_filter_and_marks_its_routes_only() -> None:
    policy = _policy(
        {**QUOTA, "clientSelectors": [{"headers": [{"name": "x-tier", "value": "free"}]}]}
    )
    doc = _render(policy)
    assert [f["name"] for f in doc["httpFilters"]] == [
        quota.ROUTE_MARK_FILTER,
        f"{quota.QUOTA_FILTER}/shop/api-limits/0",
    ]
    predicates = doc["httpFilters"][1]["typedConfig"]["bucketMatchers"]["matcherList"]["matchers"][
        0
    ]["predicate"]["andMatcher"]["predicate"]
    assert predicates[1]["singlePredicate"]["valueMatch"] == {"exact": "free"}
    assert envoy_config.RATELIMIT_FILTER not in doc["routes"][0]["typedPerFilterConfig"]
    listener_filters = gateway_xds._disabled_by_default(doc["httpFilters"])
    assert listener_filters[0]["disabled"] is True  # the mark: enabled by the policy's routes
    assert "disabled" not in listener_filters[1]
    assert_envoy_accepts(doc)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"cost": {"request": {"from": "Number", "number": 2}}}, "cost"),
        ({"shadowMode": True}, "shadowMode"),
        ({"algorithm": "SlidingWindow"}, "algorithm"),
        ({"clientSelectors": [{"sourceCIDR": {"value": "10.0.0.0/8"}}]}, "sourceCIDR"),
        ({"clientSelectors": [{"jwtClaims": [{"name": "sub", "type": "Distinct"}]}]}, "jwtClaims"),
        (
            {"clientSelectors": [{"headers": [{"name": "x", "value": "v", "invert": True}]}]},
            "headers[0].invert",
        ),
        ({"mode": "fast"}, "mode"),
    ],
)
def test_what_the_quota_filter_cannot_express_is_refused_naming_the_field(
    extra: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError) as info:
        _policy({**QUOTA, **extra})
    assert field in str(info.value)
