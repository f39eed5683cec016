"""Clusters: install template lifecycle, agent keys, revocation, config."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from mgmt_api.auth.tokens import sign_service_account
from mgmt_api.store import tables
from mgmt_api.store.engine import create_engine
from tests.mgmt_api.harness import MgmtServer, err, ok


def _agent(
    server: MgmtServer, template: dict[str, Any], ttl: float = 300, now: float | None = None
) -> httpx.Client:
    secret = template["helm"]["secrets"]["clusterServiceAccount"]
    jwk = json.loads(base64.b64decode(secret["encodedJwk"]))
    assert jwk == json.loads(secret["jwk"])
    token = sign_service_account(jwk, secret["serviceAccountFqn"], now or time.time(), ttl)
    return server.client(headers={"Authorization": f"Bearer {token}"})


def test_install_template_lifecycle_and_revocation(
    server: MgmtServer, admin: httpx.Client, org: str
) -> None:
    base = f"/v2/organizations/{org}/clusters"
    created = ok(admin.post(base, json={"name": "east", "cluster": {"tier1Cluster": True}}))
    template = created["installTemplate"]
    mp = template["helm"]["spec"]["managementPlane"]
    assert mp["port"] == server.port and mp["clusterName"] == "east"
    assert template["helm"]["spec"]["tier1Cluster"] is True
    assert created["tokenTtl"] == "3600s"
    sa_fqn = f"organizations/{org}/clusters/east/serviceaccounts/agent"
    assert created["serviceAccount"]["fqn"] == sa_fqn
    assert "privateKey" in created["serviceAccount"]["keys"][0]

    # never stored: a plain GET has no template, and the SA exposes public keys only
    got = ok(admin.get(f"{base}/east"))
    assert "installTemplate" not in got
    sa_view = ok(admin.get(f"/v2/{sa_fqn}"))
    assert all("privateKey" not in k for k in sa_view["keys"])

    # the agent authenticates with the API key but holds no role: REST reads and
    # writes of its cluster are 403 (its only REST call is the inventory report)
    with _agent(server, template) as agent:
        err(agent.post(f"{base}/east/config"), 403)
        etag = ok(admin.get(f"{base}/east"))["etag"]
        err(agent.put(f"{base}/east", json={"tokenTtl": "720h", "etag": etag}), 403)
        assert ok(agent.get(f"{base}/east/permissions"))["rules"] == []
        err(agent.get(f"/v2/organizations/{org}"), 403)
    # each component has its own account, none bound to a role on the cluster
    secrets = template["helm"]["secrets"]
    names = {"clusterServiceAccount": "agent"} | {
        f"{c}ServiceAccount": c for c in ("gateway", "extauthz", "ratelimit")
    }
    assert set(secrets) == set(names)
    for entry, name in names.items():
        assert secrets[entry]["serviceAccountFqn"] == f"{base[4:]}/east/serviceaccounts/{name}"
    policy = ok(admin.get(f"{base}/east/policy"))
    assert "serviceaccounts/" not in json.dumps(policy)

    # includeInstallTemplate mints a new key; both keys work
    again = ok(admin.get(f"{base}/east", params={"includeInstallTemplate": "true"}))
    second = again["installTemplate"]
    assert (
        second["helm"]["secrets"]["clusterServiceAccount"]["keyId"]
        != template["helm"]["secrets"]["clusterServiceAccount"]["keyId"]
    )
    assert len(ok(admin.get(f"/v2/{sa_fqn}/jwks"))["keys"]) == 2
    with _agent(server, second) as agent:
        err(agent.get(f"{base}/east"), 403)

    # delete unregisters the cluster and revokes every agent key
    old = _agent(server, template)
    ok(admin.delete(f"{base}/east"))
    err(old.get(f"{base}/east"), 401, "UNAUTHENTICATED")
    with _agent(server, second) as agent:
        err(agent.post(f"{base}/east/config"), 401)
    old.close()
    engine = create_engine(server.database_url)
    try:
        with engine.connect() as conn:
            left = conn.execute(
                sa.select(sa.func.count())
                .select_from(tables.sa_keys)
                .where(tables.sa_keys.c.owner == sa_fqn)
            ).scalar_one()
        assert left == 0
    finally:
        engine.dispose()


def test_token_ttl_is_honoured(server: MgmtServer, admin: httpx.Client, org: str) -> None:
    base = f"/v2/organizations/{org}/clusters"
    created = ok(admin.post(base, json={"name": "short", "cluster": {"tokenTtl": "10m"}}))
    assert created["tokenTtl"] == "600s"
    template = created["installTemplate"]
    with _agent(server, template, ttl=600) as agent:  # authenticated, holds no role
        err(agent.get(f"{base}/short"), 403)
    with _agent(server, template, ttl=3600) as agent:  # longer than tokenTtl
        body = err(agent.get(f"{base}/short"), 401)
        assert "tokenTtl" in body["message"]
    with _agent(server, template, ttl=60, now=time.time() - 3600) as agent:  # expired
        err(agent.get(f"{base}/short"), 401)
    body = err(admin.post(base, json={"name": "bad", "cluster": {"tokenTtl": "soon"}}), 400)
    assert body["message"].startswith("cluster.tokenTtl")


def test_fetch_workloads(server: MgmtServer, admin: httpx.Client, org: str) -> None:
    """Agent-reported namespaces are seeded in the store (the inventory API is a later issue)."""
    base = f"/v2/organizations/{org}/clusters"
    ok(admin.post(base, json={"name": "w", "cluster": {}}))
    engine = create_engine(server.database_url)
    try:
        with engine.begin() as conn:
            status = {
                "namespaces": [
                    {
                        "name": "shop",
                        "services": [{"name": "cart", "workloads": [{"name": "cart-1"}]}],
                    }
                ],
                "state": {"provider": "kind"},
            }
            conn.execute(
                sa.update(tables.resources)
                .where(tables.resources.c.fqn == f"organizations/{org}/clusters/w")
                .values(status=json.dumps(status))
            )
    finally:
        engine.dispose()
    plain = ok(admin.get(f"{base}/w"))
    assert plain["namespaces"] == [{"name": "shop", "services": [{"name": "cart"}]}]
    assert plain["state"] == {"provider": "kind"}
    full = ok(admin.get(f"{base}/w", params={"fetchWorkloads": "true"}))
    assert full["namespaces"][0]["services"][0]["workloads"] == [{"name": "cart-1"}]
    listed = ok(admin.get(base))["clusters"][0]
    assert "workloads" not in listed["namespaces"][0]["services"][0]
    listed = ok(admin.get(base, params={"fetchWorkloads": "true"}))["clusters"][0]
    assert "workloads" in listed["namespaces"][0]["services"][0]


# ---- gateway knobs: rateLimit.timeout, extAuthz, circuitBreakers -------------------------


def _violation(body: dict[str, Any]) -> str:
    violations = [d for d in body["details"] if "fieldViolations" in d]
    assert violations, body
    return str(violations[0]["fieldViolations"][0]["field"])


KNOBS: dict[str, Any] = {
    "rateLimit": {"timeout": "250ms", "failureMode": "deny"},
    "extAuthz": {"timeout": "1s", "failureModeAllow": True},
    "circuitBreakers": {"maxPendingRequests": 1, "maxRequests": 2},
}
STORED_KNOBS: dict[str, Any] = {
    "rateLimit": {"timeout": "0.25s", "failureMode": "deny"},
    "extAuthz": {"timeout": "1s", "failureModeAllow": True},
    "circuitBreakers": {"maxPendingRequests": 1, "maxRequests": 2},
}


def test_gateway_knobs_are_stored_normalized_and_synced_in_cluster_config(
    admin: httpx.Client, org: str
) -> None:
    base = f"/v2/organizations/{org}/clusters"
    created = ok(admin.post(base, json={"name": "gw", "cluster": KNOBS}))
    for key, value in STORED_KNOBS.items():
        assert created[key] == value, key
    config = ok(admin.post(f"{base}/gw/config"))
    for key, value in STORED_KNOBS.items():
        assert config[key] == value, key
    # Unset, nothing is invented: the renderer's defaults apply (docs/api.md).
    ok(admin.post(base, json={"name": "plain", "cluster": {}}))
    plain = ok(admin.post(f"{base}/plain/config"))
    assert not {"rateLimit", "extAuthz", "circuitBreakers"} & set(plain)


def test_gateway_knobs_follow_profile_defaults_and_mandates_in_cluster_config(
    admin: httpx.Client, org: str
) -> None:
    org_path = f"/v2/organizations/{org}"
    defaults = {"circuitBreakers": {"maxRetries": 5}, "extAuthz": {"timeout": "0.3s"}}
    mandates = {"extAuthz": {"failureModeAllow": False}}
    ok(
        admin.post(
            f"{org_path}/profiles",
            json={"name": "gw", "profile": {"defaults": defaults, "mandates": mandates}},
        )
    )
    current = ok(admin.get(org_path))
    ok(admin.put(org_path, json={**current, "profiles": [f"organizations/{org}/profiles/gw"]}))
    own = {"extAuthz": {"failureModeAllow": True}, "circuitBreakers": {"maxRequests": 9}}
    ok(admin.post(f"{org_path}/clusters", json={"name": "c", "cluster": own}))
    config = ok(admin.post(f"{org_path}/clusters/c/config"))
    assert config["extAuthz"] == {"timeout": "0.3s", "failureModeAllow": False}  # mandated
    assert config["circuitBreakers"] == {"maxRetries": 5, "maxRequests": 9}


@pytest.mark.parametrize(
    ("cluster", "field", "says"),
    [
        # wrong JSON types: refused, never coerced
        ({"rateLimit": {"timeout": 100}}, "cluster.rateLimit.timeout", "string"),
        ({"extAuthz": {"timeout": 0.2}}, "cluster.extAuthz.timeout", "string"),
        ({"extAuthz": {"failureModeAllow": "false"}}, "cluster.extAuthz.failureModeAllow", "bool"),
        ({"extAuthz": {"failureModeAllow": 0}}, "cluster.extAuthz.failureModeAllow", "bool"),
        ({"circuitBreakers": {"maxRequests": "5"}}, "cluster.circuitBreakers.maxRequests", "int"),
        ({"circuitBreakers": {"maxRetries": 3.0}}, "cluster.circuitBreakers.maxRetries", "int"),
        ({"circuitBreakers": {"maxRetries": True}}, "cluster.circuitBreakers.maxRetries", "int"),
        ({"circuitBreakers": []}, "cluster.circuitBreakers", ""),
        ({"extAuthz": "on"}, "cluster.extAuthz", ""),
        # out of range
        ({"rateLimit": {"timeout": "0.5ms"}}, "cluster.rateLimit.timeout", "between 1ms and 60s"),
        ({"rateLimit": {"timeout": "61s"}}, "cluster.rateLimit.timeout", "between 1ms and 60s"),
        ({"extAuthz": {"timeout": "2m"}}, "cluster.extAuthz.timeout", "between 1ms and 60s"),
        ({"extAuthz": {"timeout": "0s"}}, "cluster.extAuthz.timeout", "positive"),
        ({"rateLimit": {"timeout": "0.0015s"}}, "cluster.rateLimit.timeout", "milliseconds"),
        ({"rateLimit": {"timeout": "fast"}}, "cluster.rateLimit.timeout", "not a duration"),
        (
            {"circuitBreakers": {"maxConnections": 0}},
            "cluster.circuitBreakers.maxConnections",
            "greater than or equal to 1",
        ),
        (
            {"circuitBreakers": {"maxPendingRequests": 2**31}},
            "cluster.circuitBreakers.maxPendingRequests",
            "less than or equal to 2147483647",
        ),
        # a trust domain SPIFFE refuses (docs/mesh.md)
        ({"trustDomain": "Prod.Example"}, "cluster.trustDomain", "SPIFFE trust domain"),
        ({"trustDomain": "spiffe://x"}, "cluster.trustDomain", "SPIFFE trust domain"),
        # unknown fields
        ({"extAuthz": {"timeoutMs": 100}}, "cluster.extAuthz.timeoutMs", "unknown field"),
        ({"circuitBreakers": {"maxHosts": 1}}, "cluster.circuitBreakers.maxHosts", "unknown field"),
        (
            {"rateLimit": {"failureModeDeny": True}},
            "cluster.rateLimit.failureModeDeny",
            "unknown field",
        ),
    ],
)
def test_gateway_knob_rejections_name_the_field(
    admin: httpx.Client, org: str, cluster: dict[str, Any], field: str, says: str
) -> None:
    base = f"/v2/organizations/{org}/clusters"
    body = err(admin.post(base, json={"name": "bad", "cluster": cluster}), 400)
    assert _violation(body) == field, body
    assert says in body["message"], body
    err(admin.get(f"{base}/bad"), 404)


def test_the_template_creates_an_account_the_cluster_lacks(
    server: MgmtServer, admin: httpx.Client, org: str
) -> None:
    """A cluster created before its extauthz account existed (or whose account was
    deleted) gets it back, with a key, from the next template."""
    base = f"/v2/organizations/{org}/clusters"
    ok(admin.post(base, json={"name": "old", "cluster": {}}))
    account = f"{base}/old/serviceaccounts/extauthz"
    ok(admin.delete(account))
    err(admin.get(account), 404)
    template = ok(admin.get(f"{base}/old", params={"includeInstallTemplate": "true"}))
    entry = template["installTemplate"]["helm"]["secrets"]["extauthzServiceAccount"]
    keys = ok(admin.get(account))["keys"]
    assert [k["id"] for k in keys] == [entry["keyId"]]
