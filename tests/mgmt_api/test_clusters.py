"""Clusters: install template lifecycle, agent keys, revocation, config."""

from __future__ import annotations

import base64
import json
import time

import httpx
import sqlalchemy as sa

from mgmt_api.auth.tokens import sign_service_account
from mgmt_api.store import repo
from mgmt_api.store.engine import create_engine
from tests.mgmt_api.harness import MgmtServer, err, ok


def _agent(
    server: MgmtServer, template: dict, ttl: float = 300, now: float | None = None
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

    # the agent authenticates with the API key and may manage its cluster
    with _agent(server, template) as agent:
        cfg = ok(agent.post(f"{base}/east/config"))
        assert (
            cfg["cluster"] == f"organizations/{org}/clusters/east" and cfg["tier1Cluster"] is True
        )
        perms = ok(agent.get(f"{base}/east/permissions"))["rules"][0]["permissions"]
        assert perms == ["READ", "WRITE", "CREATE"]
        err(agent.get(f"/v2/organizations/{org}"), 403)

    # includeInstallTemplate mints a new key; both keys work
    again = ok(admin.get(f"{base}/east", params={"includeInstallTemplate": "true"}))
    second = again["installTemplate"]
    assert (
        second["helm"]["secrets"]["clusterServiceAccount"]["keyId"]
        != template["helm"]["secrets"]["clusterServiceAccount"]["keyId"]
    )
    assert len(ok(admin.get(f"/v2/{sa_fqn}/jwks"))["keys"]) == 2
    with _agent(server, second) as agent:
        ok(agent.get(f"{base}/east"))

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
                .select_from(repo.sa_keys)
                .where(repo.sa_keys.c.owner == sa_fqn)
            ).scalar_one()
        assert left == 0
    finally:
        engine.dispose()


def test_token_ttl_is_honoured(server: MgmtServer, admin: httpx.Client, org: str) -> None:
    base = f"/v2/organizations/{org}/clusters"
    created = ok(admin.post(base, json={"name": "short", "cluster": {"tokenTtl": "10m"}}))
    assert created["tokenTtl"] == "600s"
    template = created["installTemplate"]
    with _agent(server, template, ttl=600) as agent:
        ok(agent.get(f"{base}/short"))
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
                sa.update(repo.resources)
                .where(repo.resources.c.fqn == f"organizations/{org}/clusters/w")
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
