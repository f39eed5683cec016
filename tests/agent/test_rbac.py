"""Who may call each proxytools endpoint: READ on the cluster for reads, WRITE for PUT.

The matrix, per endpoint: no credentials 401; a user with no grant 403
(naming the missing permission); a reader of the cluster may read but not
set levels; a writer may do both; a reader of the organization inherits
READ on its clusters; a writer of cluster ``b`` has nothing on ``a``.
"""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.agent.fleet import ORG, Fleet
from tests.mgmt_api.harness import ok
from tests.mgmt_api.rbac_helpers import grant

WEB = {"namespace": "shop", "workload": "web", "instance": "web-1"}
ENDPOINTS = [
    ("POST", "clusterstats", WEB, "READ"),
    ("POST", "serverstats", {**WEB, "filter": "server.live"}, "READ"),
    ("POST", "configdump", {**WEB, "resource": "static_clusters"}, "READ"),
    ("POST", "loggerlevels", WEB, "READ"),
    ("PUT", "loggerlevels", {**WEB, "loggers": {"misc": "info"}}, "WRITE"),
    ("POST", "streamlogs", {**WEB, "tailLines": 1}, "READ"),
]
# role holder -> the permissions it has on cluster a
HOLDERS = {
    "nobody": set(),
    "cluster-reader": {"READ"},
    "cluster-writer": {"READ", "WRITE"},
    "org-reader": {"READ"},
    "other-cluster-writer": set(),
}


@pytest.fixture(scope="module")
def users(fleet: Fleet) -> dict[str, httpx.Client]:
    clients: dict[str, httpx.Client] = {}
    grants = {
        "cluster-reader": (f"organizations/{ORG}/clusters/a", "rbac/reader"),
        "cluster-writer": (f"organizations/{ORG}/clusters/a", "rbac/writer"),
        "org-reader": (f"organizations/{ORG}", "rbac/reader"),
        "other-cluster-writer": (f"organizations/{ORG}/clusters/b", "rbac/writer"),
    }
    for holder in HOLDERS:
        name = f"{holder}-{uuid.uuid4().hex[:6]}"
        user = {"loginName": name, "password": "user-password-1"}
        ok(fleet.admin.post(f"/v2/organizations/{ORG}/users", json={"name": name, "user": user}))
        if holder in grants:
            fqn, role = grants[holder]
            grant(fleet.admin, fqn, role, {"user": f"organizations/{ORG}/users/{name}"})
        clients[holder] = fleet.mgmt.client(auth=(f"{ORG}/{name}", "user-password-1"))
    return clients


@pytest.mark.parametrize(("method", "endpoint", "body", "needs"), ENDPOINTS)
def test_rbac_matrix(
    fleet: Fleet,
    users: dict[str, httpx.Client],
    method: str,
    endpoint: str,
    body: dict[str, object],
    needs: str,
) -> None:
    anonymous = httpx.request(method, fleet.mgmt.url + fleet.path(endpoint), json=body)
    assert anonymous.status_code == 401
    for holder, permissions in HOLDERS.items():
        response = users[holder].request(method, fleet.path(endpoint), json=body)
        if needs in permissions:
            assert response.status_code == 200, (holder, response.text)
        else:
            assert response.status_code == 403, (holder, response.text)
            assert f"missing permission {needs}" in response.json()["message"]
