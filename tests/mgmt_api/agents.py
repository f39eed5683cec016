"""Simulated cluster agents: clusters created over the API, reports signed with their keys."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from mgmt_api.auth.tokens import sign_service_account
from tests.mgmt_api.harness import MgmtServer, ok
from tests.support.cluster_credentials import credential


def create_cluster(admin: httpx.Client, org: str, name: str) -> dict[str, Any]:
    """Create a cluster; the response carries the install template with the agent key."""
    created: dict[str, Any] = ok(
        admin.post(f"/v2/organizations/{org}/clusters", json={"name": name, "cluster": {}})
    )
    return created


def agent(server: MgmtServer, cluster: dict[str, Any], component: str = "agent") -> httpx.Client:
    """A REST client that authenticates as the cluster's agent (JWT signed with its API
    key), or as another of the cluster's accounts (``component``)."""
    secret = credential(cluster, component)
    token = sign_service_account(
        json.loads(secret["jwk"]), secret["serviceAccountFqn"], time.time(), 600
    )
    return server.client(headers={"Authorization": f"Bearer {token}"})


def namespace(
    name: str, *services: str, workloads: bool = False, onboarded: bool | None = None
) -> dict[str, Any]:
    """A reported namespace with services listening on port 8080 (one workload each).

    ``onboarded`` is the agent's explicit flag (left out when None).
    """
    return {
        "name": name,
        **({} if onboarded is None else {"onboarded": onboarded}),
        "services": [
            {
                "name": svc,
                "ports": [{"number": 8080, "name": "http"}],
                **(
                    {"workloads": [{"name": f"{svc}-0", "address": "10.0.0.1"}]}
                    if workloads
                    else {}
                ),
            }
            for svc in services
        ],
    }


def inventory_path(cluster: dict[str, Any]) -> str:
    return f"/v2/{cluster['fqn']}/inventory"


def revision(admin: httpx.Client, cluster: dict[str, Any]) -> int:
    """The store's write revision (what wakes the policy distribution), via ClusterConfig."""
    value: int = ok(admin.post(f"/v2/{cluster['fqn']}/config"))["revision"]
    return value


def report(
    client: httpx.Client, cluster: dict[str, Any], *namespaces: dict[str, Any]
) -> httpx.Response:
    body = {
        "namespaces": list(namespaces),
        "state": {"provider": "kind", "istioVersions": ["1.22"]},
    }
    return client.put(inventory_path(cluster), json=body)


@contextmanager
def tuned_server(**env: str) -> Iterator[MgmtServer]:
    """A dedicated SQLite server started with extra environment settings."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        server = MgmtServer().start()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        yield server
    finally:
        server.close()
