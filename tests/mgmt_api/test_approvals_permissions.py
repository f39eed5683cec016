"""Every approvals endpoint x {no credentials, every other approval permission, its own}.

Each operation has its own permission: a principal whose custom role grants
every approval permission *but* the operation's is refused with 403 naming
it, and a principal whose role grants *only* that one succeeds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from mgmt_api.service.approvals import OPERATIONS, Operation
from tests.mgmt_api.harness import MgmtServer, err, ok, unique
from tests.mgmt_api.rbac_helpers import bound_account

SUBJECT = "organizations/acme/users/someone"
ACCESS = {"access": {"subject": SUBJECT, "permissions": ["GET"]}}


@dataclass(frozen=True)
class Case:
    operation: str
    method: str
    suffix: str
    body: dict[str, Any] | None
    setup: tuple[str, ...]  # what must exist first: "policy", "request", "approved"


CASES = [
    Case("ReadApprovalPolicy", "GET", "", None, ("policy",)),
    Case("CreateApprovalPolicy", "POST", "", {"mode": "REQUIRE_APPROVAL"}, ()),
    Case("WriteApprovalPolicy", "POST", "", {"mode": "ALLOW_REQUESTED"}, ("policy",)),
    Case("DeleteApprovalPolicy", "DELETE", "", None, ("policy",)),
    Case("WriteApprovalPolicyAccessRequest", "POST", "/requested:add", ACCESS, ("policy",)),
    Case(
        "WriteApprovalPolicyApproveAccess",
        "POST",
        "/requested:approve",
        ACCESS,
        ("policy", "request"),
    ),
    Case(
        "DeleteApprovalPolicyAccessRequest",
        "POST",
        "/requested:delete",
        {"subject": SUBJECT},
        ("policy", "request"),
    ),
    Case("CreateApprovalPolicyApprovedAccess", "POST", "/approved:add", ACCESS, ("policy",)),
    Case(
        "DeleteApprovalPolicyApprovedAccess",
        "POST",
        "/approved:delete",
        {"subject": SUBJECT},
        ("policy", "approved"),
    ),
    Case("ReadApprovalPolicy", "POST", "/query", {"includeDetails": True}, ("policy",)),
    Case(
        "CheckApprovalPolicyAccess",
        "POST",
        ":check",
        {"subject": SUBJECT, "permission": "GET"},
        ("policy",),
    ),
]


def test_every_operation_is_covered() -> None:
    assert {c.operation for c in CASES} == {op.name for op in OPERATIONS}


def _role(admin: httpx.Client, ops: list[Operation]) -> str:
    name = unique("role")
    rules = [{"types": [{"kinds": [op.kind]}], "permissions": [op.permission]} for op in ops]
    ok(admin.post("/v2/rbac", json={"name": name, "role": {"rules": rules}}))
    return f"rbac/{name}"


@pytest.fixture
def principal(admin: httpx.Client, server: MgmtServer) -> Iterator[Callable[..., httpx.Client]]:
    clients: list[httpx.Client] = []

    def make(org: str, role: str, on: str) -> httpx.Client:
        _, client = bound_account(server, admin, org, role, on)
        clients.append(client)
        return client

    yield make
    for c in clients:
        c.close()


@pytest.mark.parametrize("variant", ["organization", "cluster"])
@pytest.mark.parametrize(
    "case", CASES, ids=[f"{c.operation}:{c.suffix or c.method}" for c in CASES]
)
def test_operation_needs_its_own_permission(
    server: MgmtServer,
    admin: httpx.Client,
    org: str,
    principal: Callable[..., httpx.Client],
    case: Case,
    variant: str,
) -> None:
    fqn = f"organizations/{org}"
    if variant == "cluster":
        ok(admin.post(f"/v2/{fqn}/clusters", json={"name": "c", "cluster": {}}))
        fqn += "/clusters/c"
    path = f"/v2/{fqn}/approvals"
    if "policy" in case.setup:
        ok(admin.post(path, json={"mode": "REQUIRE_APPROVAL"}))
    if "request" in case.setup:
        ok(admin.post(path + "/requested:add", json=ACCESS))
    if "approved" in case.setup:
        ok(admin.post(path + "/approved:add", json=ACCESS))
    own = next(op for op in OPERATIONS if op.name == case.operation)
    others = _role(admin, [op for op in OPERATIONS if op != own])
    only = _role(admin, [own])

    def attempt(client: httpx.Client) -> httpx.Response:
        return client.request(case.method, path + case.suffix, json=case.body)

    with server.client() as anonymous:
        err(attempt(anonymous), 401, "UNAUTHENTICATED")
    if case.suffix == "/query":  # a query is filtered, like a list, not refused
        assert ok(attempt(principal(org, others, fqn))) == {"policies": []}
    else:
        body = err(attempt(principal(org, others, fqn)), 403, "PERMISSION_DENIED")
        assert case.operation in body["message"]
    result = ok(attempt(principal(org, only, fqn)))
    if case.suffix == "/query":
        assert [p["resource"] for p in result["policies"]] == [fqn]
    elif case.suffix == ":check":
        assert result["allowed"] is False


def test_query_hides_policies_the_caller_may_not_read(
    admin: httpx.Client, org: str, principal: Callable[..., httpx.Client]
) -> None:
    base = f"/v2/organizations/{org}"
    for cluster in ("c1", "c2"):
        ok(admin.post(f"{base}/clusters", json={"name": cluster, "cluster": {}}))
        ok(admin.post(f"{base}/clusters/{cluster}/approvals", json={"mode": "UNRESTRICTED"}))
    ok(admin.post(f"{base}/approvals", json={"mode": "UNRESTRICTED"}))
    reader = principal(org, "rbac/reader", f"organizations/{org}/clusters/c2")
    policies = ok(reader.post(f"{base}/approvals/query", json={}))["policies"]
    assert [p["resource"] for p in policies] == [f"organizations/{org}/clusters/c2"]


def test_set_policy_cannot_grant_without_the_grant_permission(
    admin: httpx.Client, org: str, principal: Callable[..., httpx.Client]
) -> None:
    """Holding Create/WriteApprovalPolicy is not holding
    CreateApprovalPolicyApprovedAccess: the lists are refused on SetPolicy."""
    fqn = f"organizations/{org}"
    path = f"/v2/{fqn}/approvals"
    setter = next(op for op in OPERATIONS if op.name == "CreateApprovalPolicy")
    writer = next(op for op in OPERATIONS if op.name == "WriteApprovalPolicy")
    client = principal(org, _role(admin, [setter, writer]), fqn)
    grant_ = {"subject": SUBJECT, "permissions": ["GET"]}
    err(client.post(path, json={"mode": "REQUIRE_APPROVAL", "approved": [grant_]}), 400)
    ok(client.post(path, json={"mode": "REQUIRE_APPROVAL"}))
    err(client.post(path, json={"mode": "REQUIRE_APPROVAL", "approved": [grant_]}), 400)
    check = ok(admin.post(f"{path}:check", json={"subject": SUBJECT, "permission": "GET"}))
    assert check["allowed"] is False
    logs = ok(admin.get(f"/v2/{fqn}/auditlogs", params={"pageSize": 100}))["auditLogs"]
    assert [a["operation"] for a in logs if a["kind"] == "ApprovalPolicy"] == [
        "SET_APPROVAL_POLICY"
    ]


@pytest.mark.parametrize("variant", ["organization", "cluster"])
def test_query_tells_no_one_without_rights_whether_the_resource_exists(
    admin: httpx.Client, org: str, principal: Callable[..., httpx.Client], variant: str
) -> None:
    """Permission before existence: without ReadApprovalPolicy a missing and an
    existing resource answer alike; with it, a missing one is 404."""
    ok(admin.post(f"/v2/organizations/{org}/clusters", json={"name": "c", "cluster": {}}))
    missing_org = unique("nope")
    existing = f"organizations/{org}" + ("/clusters/c" if variant == "cluster" else "")
    missing = (
        f"organizations/{org}/clusters/nope"
        if variant == "cluster"
        else f"organizations/{missing_org}"
    )
    ok(admin.post(f"/v2/{existing}/approvals", json={"mode": "UNRESTRICTED"}))
    # a principal of this organization that may read clusters but no approval policy
    clusters_only = unique("role")
    rules = [{"types": [{"kinds": ["Cluster"]}], "permissions": ["READ"]}]
    ok(admin.post("/v2/rbac", json={"name": clusters_only, "role": {"rules": rules}}))
    outsider = principal(org, f"rbac/{clusters_only}", f"organizations/{org}")
    for fqn in (existing, missing):
        assert ok(outsider.post(f"/v2/{fqn}/approvals/query", json={})) == {"policies": []}
    # one who may read policies in the whole organization learns what exists
    reader = principal(org, "rbac/reader", f"organizations/{org}")
    assert len(ok(reader.post(f"/v2/{existing}/approvals/query", json={}))["policies"]) == 1
    if variant == "cluster":
        err(reader.post(f"/v2/{missing}/approvals/query", json={}), 404, "NOT_FOUND")
    else:  # another organization: no rights there either, so no answer about it
        assert ok(reader.post(f"/v2/{missing}/approvals/query", json={})) == {"policies": []}
        err(admin.post(f"/v2/{missing}/approvals/query", json={}), 404, "NOT_FOUND")
