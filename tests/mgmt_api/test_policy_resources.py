"""BackendTrafficPolicy, SecuritySetting and ExtAuthzPolicy over REST.

They are ordinary kinds (etags, RBAC, audit), validated by the models the
compiler and the ext_authz loader use, so errors name the field as written.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.mgmt_api.harness import err, ok, unique
from tests.mgmt_api.rbac_helpers import grant
from tests.support.envoy import get_envoyconfig


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


def with_rule(**fields: Any) -> dict[str, Any]:
    policy = traffic_policy()
    policy["spec"]["rateLimit"]["global"]["rules"][0].update(fields)
    return policy


def with_target(**fields: Any) -> dict[str, Any]:
    policy = traffic_policy()
    policy["spec"]["targetRef"].update(fields)
    return policy


EXTAUTHZ_POLICY: dict[str, dict[str, Any]] = {
    "jwt": {
        "algorithms": ["HS256"],
        "keys": [{"hmacSecret": {"value": "a-long-test-secret-of-32-bytes-or-more"}}],
    },
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
        # Strict: no coercion of strings, floats or booleans into the limit.
        (
            traffic_policy(requests="3"),  # type: ignore[arg-type]
            "backendTrafficPolicy.spec.rateLimit.global.rules[0].limit.requests",
        ),
        (
            traffic_policy(requests=3.0),  # type: ignore[arg-type]
            "backendTrafficPolicy.spec.rateLimit.global.rules[0].limit.requests",
        ),
        (
            traffic_policy(requests=True),
            "backendTrafficPolicy.spec.rateLimit.global.rules[0].limit.requests",
        ),
        (
            with_rule(shadowMode="yes"),
            "backendTrafficPolicy.spec.rateLimit.global.rules[0].shadowMode",
        ),
        (
            with_rule(cost={"request": {"from": "Number", "number": "2"}}),
            "backendTrafficPolicy.spec.rateLimit.global.rules[0].cost.request.number",
        ),
        (
            with_rule(cost={"request": {"from": "Metadata", "metadata": {"key": "k"}}}),
            "backendTrafficPolicy.spec.rateLimit.global.rules[0].cost.request.from",
        ),
        (
            with_target(group="example.com"),
            "backendTrafficPolicy.spec.targetRef.group",
        ),
        (with_target(kind="Service"), "backendTrafficPolicy.spec.targetRef.kind"),
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


def test_traffic_policy_is_stored_as_the_model_read_it(admin: httpx.Client, cluster: str) -> None:
    """Envoy Gateway's ``cost.request`` shape, the bare-integer form stored in it,
    an explicit Gateway API group, and normalised values (header names)."""
    policy = traffic_policy()
    policy["spec"]["targetRef"]["group"] = "gateway.networking.k8s.io"
    rules = policy["spec"]["rateLimit"]["global"]["rules"]
    rules[0]["cost"] = {"request": {"from": "Number", "number": 2}}
    selector = {"headers": [{"name": "X-User", "type": "Distinct"}]}
    rules.append({"limit": {"requests": 9, "unit": "Hour"}, "cost": {"request": 4}})
    rules[1]["clientSelectors"] = [selector]
    created = ok(
        admin.post(
            f"{cluster}/backendtrafficpolicies",
            json={"name": "default.costs", "backendTrafficPolicy": policy},
        )
    )
    stored = created["spec"]["rateLimit"]["global"]["rules"]
    assert stored[0]["cost"] == {"request": {"from": "Number", "number": 2}}
    assert stored[1]["cost"] == {"request": {"from": "Number", "number": 4}}
    assert stored[1]["clientSelectors"][0]["headers"][0]["name"] == "x-user"
    assert (
        ok(admin.get(f"{cluster}/backendtrafficpolicies/default.costs"))["spec"] == created["spec"]
    )
    rendered = get_envoyconfig(admin, cluster)
    (route,) = [r for r in rendered["routes"] if r["name"].endswith("default.costs")]
    actions = route["typedPerFilterConfig"]["envoy.filters.http.ratelimit"]["rateLimits"]
    assert [a["hitsAddend"]["number"] for a in actions] == ["2", "4"]


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
            "mode": "CLUSTER",
            "http": {"external": {"uri": "grpc://extauthz.mesh:9191", "policy": "jwt"}},
        }
    }
    created = ok(admin.post(f"{group}/settings", json={"name": "s", "securitySetting": setting}))
    assert created["authorization"]["mode"] == "CLUSTER"
    policy = ok(
        admin.post(
            f"{group}/extauthzpolicies", json={"name": "jwt", "extAuthzPolicy": EXTAUTHZ_POLICY}
        )
    )
    assert policy["jwt"]["algorithms"] == ["HS256"]


LOCAL_RULES: list[dict[str, Any]] = [
    {
        "from": [{"jwt": {"iss": "https://idp", "sub": "alice", "other": {"team": "ops"}}}],
        "to": [{"paths": ["/admin/*"], "methods": ["GET", "POST"]}],
    }
]


def _local(**overrides: Any) -> dict[str, Any]:
    """A SecuritySetting with local JWT rules, with some keys of ``local`` replaced."""
    local = {"rules": LOCAL_RULES, "keys": {"jwks": {"uri": "https://idp/jwks"}}, **overrides}
    return {"authorization": {"http": {"local": local}}}


def test_local_jwt_rules_round_trip(admin: httpx.Client, group: str) -> None:
    """Local rules in the reference's shape are stored and read back as given."""
    setting = _local(clockSkew=30)
    created = ok(admin.post(f"{group}/settings", json={"name": "l", "securitySetting": setting}))
    local = created["authorization"]["http"]["local"]
    assert local["rules"] == LOCAL_RULES
    assert local["clockSkew"] == 30


def test_custom_mode_is_an_explicit_service_account_list(admin: httpx.Client, group: str) -> None:
    """Reference: ``CUSTOM`` = explicit ``serviceAccounts`` (``ns/sa``, ``ns/*``, ``./*``);
    it needs no ext_authz server, and may have one."""
    setting = {"authorization": {"mode": "CUSTOM", "serviceAccounts": ["shop/checkout", "./*"]}}
    created = ok(admin.post(f"{group}/settings", json={"name": "c", "securitySetting": setting}))
    assert created["authorization"]["serviceAccounts"] == ["shop/checkout", "./*"]
    external = {"external": {"uri": "grpc://extauthz.mesh:9191", "policy": "jwt"}}
    update = {"authorization": {**setting["authorization"], "http": external}}
    updated = ok(admin.put(f"{group}/settings/c", json={**update, "etag": created["etag"]}))
    # extauthz in the gateway's pod, on a Unix socket (the "sidecar services" placement)
    external = {"external": {"uri": "unix:///var/run/meshplane/extauthz.sock", "policy": "jwt"}}
    update = {"authorization": {**setting["authorization"], "http": external}}
    ok(admin.put(f"{group}/settings/c", json={**update, "etag": updated["etag"]}))


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        (
            {"authorization": {"mode": "CLUSTER", "http": {"external": {"uri": "http://x:1"}}}},
            "securitySetting.authorization.http.external.uri",
        ),
        (
            {"authorization": {"http": {"external": {"uri": "grpc://host"}}}},
            "securitySetting.authorization.http.external.uri",
        ),
        (  # a socket path must be absolute, on no host
            {"authorization": {"http": {"external": {"uri": "unix:extauthz.sock"}}}},
            "securitySetting.authorization.http.external.uri",
        ),
        (
            {"authorization": {"http": {"external": {"uri": "unix://host/extauthz.sock"}}}},
            "securitySetting.authorization.http.external.uri",
        ),
        ({"authorization": {"mode": "CUSTOM"}}, "securitySetting.authorization.serviceAccounts"),
        (
            {"authorization": {"mode": "CUSTOM", "serviceAccounts": []}},
            "securitySetting.authorization.serviceAccounts",
        ),
        (
            {"authorization": {"mode": "CUSTOM", "serviceAccounts": ["ns/sa", "Not Valid"]}},
            "securitySetting.authorization.serviceAccounts[1]",
        ),
        (
            {"authorization": {"mode": "CUSTOM", "serviceAccounts": ["ns/*", "ns/*"]}},
            "securitySetting.authorization.serviceAccounts[1]",
        ),
        (
            {"authorization": {"mode": "CLUSTER", "serviceAccounts": ["ns/sa"]}},
            "securitySetting.authorization.serviceAccounts",
        ),
        ({"authorization": {"mode": "SOMETIMES"}}, "securitySetting.authorization.mode"),
        (
            _local(keys={"jwks": {"value": "{}", "uri": "https://idp/jwks"}}),
            "securitySetting.authorization.http.local.keys",
        ),
        (
            _local(keys={"jwks": {"uri": "file:///etc/jwks"}}),
            "securitySetting.authorization.http.local.keys.jwks.uri",
        ),
        (
            _local(rules=[{"from": [{"jwt": {}}]}]),
            "securitySetting.authorization.http.local.rules[0].from[0].jwt",
        ),
        (
            _local(rules=[{"from": [{"jwt": {"iss": "i"}}], "to": [{"paths": ["admin"]}]}]),
            "securitySetting.authorization.http.local.rules[0].to[0].paths[0]",
        ),
        (
            _local(rules=[{"from": [{"jwt": {"iss": "i"}}], "to": [{"methods": ["get"]}]}]),
            "securitySetting.authorization.http.local.rules[0].to[0].methods[0]",
        ),
        (_local(clockSkew=3600), "securitySetting.authorization.http.local.clockSkew"),
        (_local(clockSkew="30"), "securitySetting.authorization.http.local.clockSkew"),
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
        (
            lambda p: p["jwt"].update(
                keys=[{"hmacSecret": {"value": "<redacted sha256:0123456789abcdef>"}}]
            ),
            "extAuthzPolicy.jwt.keys[0].hmacSecret.value",
        ),
        (  # RFC 7518 §3.2: not shorter than the hash (the TSB demo's "secret" is refused)
            lambda p: p["jwt"].update(keys=[{"hmacSecret": {"value": "secret"}}]),
            "extAuthzPolicy.jwt.keys[0].hmacSecret.value",
        ),
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


def _sha16(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()[:16]


def test_extauthz_secrets_are_write_only_and_a_get_put_round_trip_keeps_them(
    admin: httpx.Client, group: str, org: str, make_user: Callable[..., httpx.Client]
) -> None:
    """Anyone with READ could otherwise mint tokens the gateway accepts."""
    secret, other = (
        "first-hmac-secret-value-32-bytes-long",
        "second-hmac-secret-value-32-bytes-long",
    )
    jwks = json.dumps({"keys": [{"kty": "oct", "k": "c2VjcmV0LXNlY3JldC1zZWNyZXQ"}]})
    policy = {
        "jwt": {
            "algorithms": ["HS256"],
            "keys": [
                {"hmacSecret": {"value": secret}, "kid": "one"},
                {"hmacSecret": {"value": other}, "kid": "two"},
                {"jwks": {"value": jwks}},
            ],
        }
    }
    path = f"{group}/extauthzpolicies/keys"
    created = ok(
        admin.post(f"{group}/extauthzpolicies", json={"name": "keys", "extAuthzPolicy": policy})
    )
    name = unique("r")
    reader = make_user(org, name)
    grant(
        admin,
        group.removeprefix("/v2/"),
        "rbac/reader",
        {"user": f"organizations/{org}/users/{name}"},
    )
    for view in (created, ok(admin.get(path)), ok(reader.get(path))):
        text = json.dumps(view)
        assert secret not in text and other not in text and "c2VjcmV0" not in text
        keys = view["jwt"]["keys"]
        assert keys[0]["hmacSecret"]["value"] == f"<redacted sha256:{_sha16(secret)}>"
        assert keys[1]["hmacSecret"]["value"] == f"<redacted sha256:{_sha16(other)}>"
        assert keys[2]["jwks"]["value"].startswith("<redacted sha256:")
    listed = ok(admin.get(f"{group}/extauthzpolicies"))["extAuthzPolicies"]
    assert secret not in json.dumps(listed)
    # GET -> PUT with the markers, keys reordered and a leeway added: secrets kept.
    got = ok(admin.get(path))
    got["jwt"]["keys"] = [got["jwt"]["keys"][1], got["jwt"]["keys"][0], got["jwt"]["keys"][2]]
    got["jwt"]["leewaySeconds"] = 5
    updated = ok(admin.put(path, json=got))
    assert updated["jwt"]["keys"][0]["hmacSecret"]["value"].endswith(f"{_sha16(other)}>")
    # A new secret replaces; a marker of a secret this policy never had is refused.
    got = ok(admin.get(path))
    got["jwt"]["keys"][0]["hmacSecret"]["value"] = "third-hmac-secret-value-32-bytes-long"
    assert ok(admin.put(path, json=got))["jwt"]["keys"][0]["hmacSecret"]["value"].endswith(
        f"{_sha16('third-hmac-secret-value-32-bytes-long')}>"
    )
    got = ok(admin.get(path))
    got["jwt"]["keys"][1]["hmacSecret"]["value"] = f"<redacted sha256:{_sha16('never-stored')}>"
    body = err(admin.put(path, json=got), 400)
    assert field_of(body) == "extAuthzPolicy.jwt.keys[1].hmacSecret.value", body
    # The policy's own status view names it as the ext_authz snapshot does
    # (tests/e2e checks that a GET -> PUT round trip keeps enforcing the secret).
    status = ok(admin.get(f"{path}/status"))
    assert status["policyName"] == "t.w.g.keys"
    assert [c["cluster"] for c in status["clusters"]] == []  # the group reaches c1: not created


def test_traffic_policy_needs_create_permission(
    admin: httpx.Client, org: str, cluster: str, make_user: Callable[..., httpx.Client]
) -> None:
    user = make_user(org, unique("u"))
    body = {"name": "default.p", "backendTrafficPolicy": traffic_policy()}
    err(user.post(f"{cluster}/backendtrafficpolicies", json=body), 403)


def test_cluster_status_lists_desired_versions(admin: httpx.Client, cluster: str) -> None:
    status = ok(admin.get(f"{cluster}/status"))
    assert status["cluster"] == cluster.removeprefix("/v2/")
    assert set(status["desiredVersions"]) == {"ratelimit", "extauthz", "gateway", "sidecar"}
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


def test_cluster_redis_url_may_be_spec_host_port(admin: httpx.Client, org: str) -> None:
    """Spec 2.9: ``backend.redis.url`` is ``<host>:<port>``; stored (and so read by
    everyone: the API, ``.../config``, snapshots) as the ``redis://`` URL it means."""
    rate_limit = {"backend": {"type": "Redis", "redis": {"url": "redis.infra:6379"}}}
    base = f"/v2/organizations/{org}/clusters"
    created = ok(admin.post(base, json={"name": "hp", "cluster": {"rateLimit": rate_limit}}))
    stored = {"backend": {"type": "Redis", "redis": {"url": "redis://redis.infra:6379"}}}
    assert created["rateLimit"] == stored
    assert ok(admin.post(f"{base}/hp/config"))["rateLimit"] == stored
    bad = {"backend": {"redis": {"url": "redis.infra:notaport"}}}
    body = err(admin.post(base, json={"name": "hq", "cluster": {"rateLimit": bad}}), 400)
    assert field_of(body) == "cluster.rateLimit.backend.redis.url", body


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
