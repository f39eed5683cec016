"""Helpers to grant roles through the public policy API."""

from __future__ import annotations

import json
import time

import httpx

from mgmt_api.auth.tokens import sign_service_account
from tests.mgmt_api.harness import MgmtServer, ok, unique


def policy_path(fqn: str) -> str:
    if fqn == "":
        return "/v2/admin/root/policy"
    if fqn == "rbac":
        return "/v2/admin/rbac/policy"
    return f"/v2/{fqn}/policy"


def grant(admin: httpx.Client, fqn: str, role: str, subject: dict[str, str]) -> None:
    policy = ok(admin.get(policy_path(fqn)))
    allow = [*policy["allow"], {"role": role, "subjects": [subject]}]
    ok(admin.put(policy_path(fqn), json={"etag": policy["etag"], "allow": allow}))


def bound_account(
    server: MgmtServer, admin: httpx.Client, org: str, role: str, node: str
) -> tuple[str, httpx.Client]:
    """A new service account of ``organizations/{org}`` bound ``role`` on ``node``: its
    FQN and a client signed in with its JWT (no Argon2 per request, unlike Basic)."""
    created = ok(
        admin.post(
            f"/v2/organizations/{org}/serviceaccounts",
            json={"name": unique("sa"), "serviceAccount": {}},
            params={"keyEncoding": "JWK"},
        )
    )
    grant(admin, node, role, {"serviceAccount": created["fqn"]})
    token = sign_service_account(
        json.loads(created["keys"][0]["privateKey"]), created["fqn"], time.time(), 600
    )
    return created["fqn"], server.client(headers={"Authorization": f"Bearer {token}"})
