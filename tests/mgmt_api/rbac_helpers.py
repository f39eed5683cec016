"""Helpers to grant roles through the public policy API."""

from __future__ import annotations

import httpx

from tests.mgmt_api.harness import ok


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
