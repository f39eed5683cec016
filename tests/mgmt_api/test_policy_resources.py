"""BackendTrafficPolicy, SecuritySetting and ExtAuthzPolicy over REST.

They are ordinary kinds (etags, RBAC, audit), validated by the models the
compiler and the ext_authz loader use, so errors name the field as written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.mgmt_api.harness import err, ok, unique


def traffic_policy(requests: int = 3, unit: str = "Minute", **rate: Any) -> dict[str, Any]:
    rate_limit: dict[str, Any] = {
        "type": "Global",
        "global": {"rules": [{"limit": {"requests": requests, "unit": unit}}]},
    }
    rate_limit.update(rate)
    return {
        "apiVersion": "gateway.envoyproxy.io/v1alpha1",
        "kind": "BackendTrafficPolicy",
        "spec": {"targetRef": {"kind": "HTTPRoute", "name": "web"}, "rateLimit": rate_limit},
    }


EXTAUTHZ_POLICY = {
    "jwt": {"algorithms": ["HS256"], "keys": [{"hmacSecret": {"value": "a-long-test-secret"}}]},
    "pathClaim": {"name": "path", "match": "PREFIX"},
}


@pytest.fixture
def cluster(admin: httpx.Client, org: str) -> str:
    ok(admin.post(f"/v2/organizations/{org}/clusters", json={"name": "c1", "cluster": {}}))
    return f"/v2/organizations/{org}/clusters/c1"


@pytest.fixture
def group(admin: httpx.Client, org: str) -> str:
    base = f"/v2/organizations/{org}"
    ok(admin.post(f"{base}/tenants", json={"name": "t", "tenant": {}}))
    ok(
        admin.post(
            f"{base}/tenants/t/workspaces",
            json={"name": "w", "workspace": {"namespaceSelector": {"names": ["c1/*"]}}},
        )
    )
    ok(
        admin.post(
            f"{base}/tenants/t/workspaces/w/securitygroups",
            json={"name": "g", "securityGroup": {"configMode": "BRIDGED"}},
        )
    )
    return f"{base}/tenants/t/workspaces/w/securitygroups/g"


def field_of(body: dict[str, Any]) -> str:
    violations = [d for d in body["details"] if "fieldViolations" in d]
    return str(violations[0]["fieldViolations"][0]["field"])


def test_traffic_policy_crud_with_etags_and_audit(
    admin: httpx.Client, org: str, cluster: str
) -> None:
    created = ok(
        admin.post(
            f"{cluster}/backendtrafficpolicies",
            json={"name": "default.web-limit", "backendTrafficPolicy": traffic_policy()},
        )
    )
    assert created["fqn"].endswith("/clusters/c1/backendtrafficpolicies/default.web-limit")
    assert created["metadata"] == {"name": "web-limit", "namespace": "default"}
    item = f"{cluster}/backendtrafficpolicies/default.web-limit"
    got = ok(admin.get(item))
    assert got["spec"]["rateLimit"]["global"]["rules"][0]["limit"] == {
        "requests": 3,
        "unit": "Minute",
    }
    update = {**traffic_policy(5), "etag": got["etag"]}
    updated = ok(admin.put(item, json=update))
    assert updated["etag"] != got["etag"]
    err(admin.put(item, json=update), 409)  # the old etag is stale now
    listed = ok(admin.get(f"{cluster}/backendtrafficpolicies"))["backendTrafficPolicies"]
    assert [p["fqn"] for p in listed] == [created["fqn"]]
    ok(admin.delete(item))
    err(admin.get(item), 404)
    ops = [
        (log["operation"], log["kind"])
        for log in ok(admin.get(f"/v2/organizations/{org}/auditlogs"))["auditLogs"]
        if log["fqn"] == created["fqn"]
    ]
    assert ops == [
        ("DELETE", "BackendTrafficPolicy"),
        ("UPDATE", "BackendTrafficPolicy"),
        ("CREATE", "BackendTrafficPolicy"),
    ]


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        (traffic_policy(type="Local"), "backendTrafficPolicy.spec.rateLimit.type"),
        (
            traffic_policy(unit="Week"),
            "backendTrafficPolicy.spec.rateLimit.global.rules[0].limit.unit",
        ),
        (
            traffic_policy(requests=-1),
            "backendTrafficPolicy.spec.rateLimit.global.rules[0].limit.requests",
        ),
        (
            {**traffic_policy(), "metadata": {"name": "other", "namespace": "default"}},
            "backendTrafficPolicy.metadata",
        ),
    ],
)
def test_traffic_policy_rejections_name_the_field(
    admin: httpx.Client, cluster: str, policy: dict[str, Any], field: str
) -> None:
    body = err(
        admin.post(
            f"{cluster}/backendtrafficpolicies",
            json={"name": "default.bad", "backendTrafficPolicy": policy},
        ),
        400,
    )
    assert field_of(body) == field, body
    assert body["message"].startswith(field + ":")


@pytest.mark.parametrize("name", ["nonamespace", "default." + "n" * 60, "Default.x", "a.b.c"])
def test_traffic_policy_name_is_namespace_dot_name(
    admin: httpx.Client, cluster: str, name: str
) -> None:
    body = err(
        admin.post(
            f"{cluster}/backendtrafficpolicies",
            json={"name": name, "backendTrafficPolicy": traffic_policy()},
        ),
        400,
    )
    assert field_of(body) == "name", body


def test_security_setting_and_extauthz_policy(admin: httpx.Client, group: str) -> None:
    setting = {
        "authorization": {
            "mode": "CUSTOM",
            "http": {"external": {"uri": "grpc://extauthz.mesh:9191", "policy": "jwt"}},
        }
    }
    created = ok(admin.post(f"{group}/settings", json={"name": "s", "securitySetting": setting}))
    assert created["authorization"]["mode"] == "CUSTOM"
    policy = ok(
        admin.post(
            f"{group}/extauthzpolicies", json={"name": "jwt", "extAuthzPolicy": EXTAUTHZ_POLICY}
        )
    )
    assert policy["jwt"]["algorithms"] == ["HS256"]


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        (
            {"authorization": {"mode": "CUSTOM", "http": {"external": {"uri": "http://x:1"}}}},
            "securitySetting.authorization.http.external.uri",
        ),
        (
            {"authorization": {"http": {"external": {"uri": "grpc://host"}}}},
            "securitySetting.authorization.http.external.uri",
        ),
        ({"authorization": {"mode": "CUSTOM"}}, "securitySetting.authorization.http.external"),
        ({"authorization": {"mode": "SOMETIMES"}}, "securitySetting.authorization.mode"),
    ],
)
def test_security_setting_rejections(
    admin: httpx.Client, group: str, setting: dict[str, Any], field: str
) -> None:
    body = err(admin.post(f"{group}/settings", json={"name": "s", "securitySetting": setting}), 400)
    assert field_of(body) == field, body


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda p: p["jwt"].update(algorithms=["none"]), "extAuthzPolicy.jwt.algorithms[0]"),
        (
            lambda p: p["jwt"].update(keys=[{"hmacSecret": {"file": "/etc/secret"}}]),
            "extAuthzPolicy.jwt.keys[0].hmacSecret.file",
        ),
        (lambda p: p["pathClaim"].update(match="ANY"), "extAuthzPolicy.pathClaim.match"),
    ],
)
def test_extauthz_policy_validated_by_the_extauthz_loader(
    admin: httpx.Client, group: str, mutate: Callable[[dict[str, Any]], None], field: str
) -> None:
    policy = {"jwt": dict(EXTAUTHZ_POLICY["jwt"]), "pathClaim": dict(EXTAUTHZ_POLICY["pathClaim"])}
    mutate(policy)
    body = err(
        admin.post(f"{group}/extauthzpolicies", json={"name": "p", "extAuthzPolicy": policy}), 400
    )
    assert field_of(body) == field, body


def test_traffic_policy_needs_create_permission(
    admin: httpx.Client, org: str, cluster: str, make_user: Callable[..., httpx.Client]
) -> None:
    user = make_user(org, unique("u"))
    body = {"name": "default.p", "backendTrafficPolicy": traffic_policy()}
    err(user.post(f"{cluster}/backendtrafficpolicies", json=body), 403)


def test_cluster_status_lists_desired_versions(admin: httpx.Client, cluster: str) -> None:
    status = ok(admin.get(f"{cluster}/status"))
    assert status["cluster"] == cluster.removeprefix("/v2/")
    assert set(status["desiredVersions"]) == {"ratelimit", "extauthz"}
    assert status["instances"] == []
    before = status["desiredVersions"]["ratelimit"]
    ok(
        admin.post(
            f"{cluster}/backendtrafficpolicies",
            json={"name": "default.p", "backendTrafficPolicy": traffic_policy()},
        )
    )
    after = ok(admin.get(f"{cluster}/status"))["desiredVersions"]
    assert after["ratelimit"] != before
    assert after["extauthz"] == status["desiredVersions"]["extauthz"]
    policy_status = ok(admin.get(f"{cluster}/backendtrafficpolicies/default.p/status"))
    assert policy_status["desiredVersion"] == after["ratelimit"]
    assert policy_status["instances"] == []
    err(admin.get(f"{cluster}/backendtrafficpolicies/default.missing/status"), 404)


def test_cluster_rate_limit_switches_are_returned_by_cluster_config(
    admin: httpx.Client, org: str
) -> None:
    rate_limit = {
        "backend": {
            "type": "Redis",
            "redis": {
                "urlRef": {"name": "redis-url", "namespace": "meshplane"},
                "tls": {"certificateRef": {"name": "redis-ca"}},
            },
        },
        "failureMode": "deny",
    }
    base = f"/v2/organizations/{org}/clusters"
    ok(admin.post(base, json={"name": "rl", "cluster": {"rateLimit": rate_limit}}))
    config = ok(admin.post(f"{base}/rl/config"))
    assert config["rateLimit"] == rate_limit
    current = ok(admin.get(f"{base}/rl"))
    update = {**current, "rateLimit": {"redis": {"disabled": True}, "failureMode": "allow"}}
    ok(admin.put(f"{base}/rl", json=update))
    assert ok(admin.post(f"{base}/rl/config"))["rateLimit"]["redis"] == {"disabled": True}


@pytest.mark.parametrize(
    ("rate_limit", "field"),
    [
        ({"backend": {"redis": {}}}, "cluster.rateLimit.backend.redis"),
        (
            {"backend": {"redis": {"url": "redis://h:6379", "urlRef": {"name": "s"}}}},
            "cluster.rateLimit.backend.redis",
        ),
        (
            {"backend": {"redis": {"url": "redis://h:notaport"}}},
            "cluster.rateLimit.backend.redis.url",
        ),
        (
            {"backend": {"redis": {"url": "redis://:hunter2@h:6379"}}},
            "cluster.rateLimit.backend.redis.url",
        ),
        (
            {"redis": {"disabled": True}, "backend": {"redis": {"url": "redis://h:6379"}}},
            "cluster.rateLimit.backend.redis",
        ),
        ({"backend": {"type": "Memcached"}}, "cluster.rateLimit.backend.type"),
        ({"failureMode": "maybe"}, "cluster.rateLimit.failureMode"),
    ],
)
def test_cluster_rate_limit_rejections(
    admin: httpx.Client, org: str, rate_limit: dict[str, Any], field: str
) -> None:
    body = err(
        admin.post(
            f"/v2/organizations/{org}/clusters",
            json={"name": "rl", "cluster": {"rateLimit": rate_limit}},
        ),
        400,
    )
    assert field_of(body) == field, body
    assert "hunter2" not in body["message"]
