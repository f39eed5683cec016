"""The approvals state table of spec section 3, row by row, for organizations and clusters.

Each row builds a policy through the REST API of a real mgmt-api, runs one
operation and checks the status, the stored lists and what the access check
answers afterwards. Refused operations must leave the policy byte for byte
unchanged, etag included.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.mgmt_api.harness import err, ok, unique

A, B = "organizations/acme/tenants/t/applications/a", "organizations/acme/users/bob"

Op = tuple[
    Any, ...
]  # ("request"|"approve"|"grant", subject, perms) | ("withdraw"|"revoke", subject)


@dataclass(frozen=True)
class Row:
    id: str
    mode: str
    before: list[Op]
    action: Op
    status: int = 200
    requested: dict[str, list[str]] = field(default_factory=dict)
    approved: dict[str, list[str]] = field(default_factory=dict)
    checks: list[tuple[str, str, bool]] = field(default_factory=list)


ROWS = [
    Row(
        "requested:add in ALLOW_REQUESTED is allowed at once and recorded as requested",
        "ALLOW_REQUESTED",
        [],
        ("request", A, ["GET"]),
        requested={A: ["GET"]},
        checks=[(A, "GET", True), (A, "POST", False), (B, "GET", False)],
    ),
    Row(
        "requested:add in REQUIRE_APPROVAL is pending until approved",
        "REQUIRE_APPROVAL",
        [],
        ("request", A, ["GET"]),
        requested={A: ["GET"]},
        checks=[(A, "GET", False)],
    ),
    Row(
        "a repeated request adds permissions to the subject's one entry",
        "REQUIRE_APPROVAL",
        [("request", A, ["GET"])],
        ("request", A, ["POST", "GET"]),
        requested={A: ["GET", "POST"]},
    ),
    Row(
        "requested:approve moves the entry from requested to approved",
        "REQUIRE_APPROVAL",
        [("request", A, ["GET"]), ("request", B, ["GET"])],
        ("approve", A, ["GET"]),
        requested={B: ["GET"]},
        approved={A: ["GET"]},
        checks=[(A, "GET", True), (B, "GET", False)],
    ),
    Row(
        "an approval that changes the permissions keeps only the approved ones",
        "REQUIRE_APPROVAL",
        [("request", A, ["GET", "POST", "DELETE"])],
        ("approve", A, ["GET"]),
        approved={A: ["GET"]},
        checks=[(A, "GET", True), (A, "POST", False), (A, "DELETE", False)],
    ),
    Row(
        "approving in ALLOW_REQUESTED also moves the entry",
        "ALLOW_REQUESTED",
        [("request", A, ["GET"])],
        ("approve", A, ["GET", "PUT"]),
        approved={A: ["GET", "PUT"]},
        checks=[(A, "PUT", True)],
    ),
    Row(
        "requested:approve without a pending request is NOT_FOUND",
        "REQUIRE_APPROVAL",
        [("grant", A, ["GET"])],
        ("approve", B, ["GET"]),
        status=404,
        approved={A: ["GET"]},
    ),
    Row(
        "requested:delete of a request not yet approved removes it",
        "REQUIRE_APPROVAL",
        [("request", A, ["GET"]), ("request", B, ["GET"])],
        ("withdraw", A),
        requested={B: ["GET"]},
        checks=[(A, "GET", False)],
    ),
    Row(
        "requested:delete in ALLOW_REQUESTED withdraws the access it gave",
        "ALLOW_REQUESTED",
        [("request", A, ["GET"])],
        ("withdraw", A),
        checks=[(A, "GET", False)],
    ),
    Row(
        "requested:delete of an approved request is NOT_FOUND and changes nothing",
        "REQUIRE_APPROVAL",
        [("request", A, ["GET"]), ("approve", A, ["GET"])],
        ("withdraw", A),
        status=404,
        approved={A: ["GET"]},
        checks=[(A, "GET", True)],
    ),
    Row(
        "requested:delete of an unknown subject is NOT_FOUND",
        "ALLOW_REQUESTED",
        [],
        ("withdraw", A),
        status=404,
    ),
    Row(
        "approved:delete removes the approved entry",
        "REQUIRE_APPROVAL",
        [("request", A, ["GET"]), ("approve", A, ["GET"]), ("grant", B, ["GET"])],
        ("revoke", A),
        approved={B: ["GET"]},
        checks=[(A, "GET", False), (B, "GET", True)],
    ),
    Row(
        "approved:delete of a subject that is not approved is NOT_FOUND",
        "REQUIRE_APPROVAL",
        [("request", A, ["GET"])],
        ("revoke", A),
        status=404,
        requested={A: ["GET"]},
    ),
    Row(
        "approved:add grants access without a request",
        "REQUIRE_APPROVAL",
        [],
        ("grant", A, ["GET"]),
        approved={A: ["GET"]},
        checks=[(A, "GET", True), (A, "POST", False)],
    ),
    Row(
        "UNRESTRICTED allows every subject, listed or not",
        "UNRESTRICTED",
        [],
        ("request", A, ["GET"]),
        requested={A: ["GET"]},
        checks=[(A, "GET", True), (B, "DELETE", True)],
    ),
]

SUFFIX = {
    "request": "/requested:add",
    "approve": "/requested:approve",
    "grant": "/approved:add",
    "withdraw": "/requested:delete",
    "revoke": "/approved:delete",
}


@dataclass(frozen=True)
class Target:
    fqn: str

    @property
    def path(self) -> str:
        return f"/v2/{self.fqn}/approvals"


@pytest.fixture(params=["organization", "cluster"])
def target(request: pytest.FixtureRequest, admin: httpx.Client, org: str) -> Target:
    if request.param == "organization":
        return Target(f"organizations/{org}")
    ok(admin.post(f"/v2/organizations/{org}/clusters", json={"name": "c1", "cluster": {}}))
    return Target(f"organizations/{org}/clusters/c1")


def run(admin: httpx.Client, t: Target, op: Op) -> httpx.Response:
    name, subject, *perms = op
    body: dict[str, Any] = {"resource": t.fqn}
    if perms:
        body["access"] = {"subject": subject, "permissions": perms[0]}
    else:
        body["subject"] = subject
    return admin.post(t.path + SUFFIX[name], json=body)


def lists(policy: dict[str, Any], key: str) -> dict[str, list[str]]:
    return {a["subject"]: a["permissions"] for a in policy[key]}


def allowed(admin: httpx.Client, t: Target, subject: str, permission: str) -> bool:
    answer = ok(admin.post(t.path + ":check", json={"subject": subject, "permission": permission}))
    assert isinstance(answer["reason"], str) and answer["reason"]
    return bool(answer["allowed"])


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_state_table(admin: httpx.Client, target: Target, row: Row) -> None:
    ok(admin.post(target.path, json={"resource": target.fqn, "mode": row.mode}))
    for op in row.before:
        ok(run(admin, target, op))
    before = ok(admin.get(target.path))

    response = run(admin, target, row.action)

    if row.status == 200:
        assert ok(response) == {}
    else:
        err(response, row.status, "NOT_FOUND")
        assert ok(admin.get(target.path)) == before, "a refused operation changed the policy"
    policy = ok(admin.get(target.path))
    assert policy["resource"] == target.fqn
    assert policy["mode"] == row.mode
    assert lists(policy, "requested") == row.requested
    assert lists(policy, "approved") == row.approved
    for subject, permission, expected in row.checks:
        assert allowed(admin, target, subject, permission) is expected, (subject, permission)


def test_deleting_the_policy_revokes_every_approval_and_refuses_requests(
    admin: httpx.Client, target: Target
) -> None:
    ok(admin.post(target.path, json={"mode": "REQUIRE_APPROVAL"}))
    ok(run(admin, target, ("grant", A, ["GET"])))
    ok(run(admin, target, ("request", B, ["GET"])))

    assert ok(admin.delete(target.path, params={"force": "true"})) == {}

    err(admin.get(target.path), 404, "NOT_FOUND")
    for op in (("request", B, ["GET"]), ("approve", B, ["GET"]), ("revoke", A), ("withdraw", B)):
        err(run(admin, target, op), 404, "NOT_FOUND")
    check = {"subject": A, "permission": "GET"}
    err(admin.post(target.path + ":check", json=check), 404, "NOT_FOUND")
    err(admin.delete(target.path), 404, "NOT_FOUND")
    # A new policy starts empty: nothing granted before the delete survives it.
    ok(admin.post(target.path, json={"mode": "REQUIRE_APPROVAL"}))
    policy = ok(admin.get(target.path))
    assert (policy["requested"], policy["approved"]) == ([], [])
    assert allowed(admin, target, A, "GET") is False


def test_set_policy_replaces_the_mode_and_keeps_the_lists(
    admin: httpx.Client, target: Target
) -> None:
    ok(admin.post(target.path, json={"mode": "ALLOW_REQUESTED"}))
    ok(run(admin, target, ("request", A, ["GET"])))
    assert allowed(admin, target, A, "GET") is True

    etag = ok(admin.get(target.path))["etag"]
    ok(admin.post(target.path, json={"mode": "REQUIRE_APPROVAL", "etag": etag}))
    assert lists(ok(admin.get(target.path)), "requested") == {A: ["GET"]}
    assert allowed(admin, target, A, "GET") is False  # the same request is now pending

    err(admin.post(target.path, json={"mode": "UNRESTRICTED", "etag": etag}), 409, "ABORTED")


@pytest.mark.parametrize(
    "lists_",
    [
        {"approved": [{"subject": B, "permissions": ["GET"]}]},  # would grant
        {"requested": []},  # would withdraw every request
        {"approved": []},  # would revoke every approval
    ],
)
def test_set_policy_refuses_the_lists(
    admin: httpx.Client, org: str, target: Target, lists_: dict[str, Any]
) -> None:
    """Granting or revoking through SetPolicy would bypass the per-operation
    permissions and the per-subject audit: the lists change only through them."""
    ok(admin.post(target.path, json={"mode": "REQUIRE_APPROVAL"}))
    ok(run(admin, target, ("grant", A, ["GET"])))
    ok(run(admin, target, ("request", B, ["GET"])))
    before = ok(admin.get(target.path))
    [field] = lists_
    body = err(
        admin.post(target.path, json={"mode": "ALLOW_REQUESTED", **lists_}), 400, "INVALID_ARGUMENT"
    )
    assert body["details"][1]["fieldViolations"][0]["field"] == field
    assert "approved:add" in body["message"] and "requested:add" in body["message"]
    assert ok(admin.get(target.path)) == before  # nothing changed, the mode included
    # creating a policy with lists is refused the same way
    ok(admin.delete(target.path))
    err(admin.post(target.path, json={"mode": "ALLOW_REQUESTED", **lists_}), 400)
    err(admin.get(target.path), 404)


def test_bodies_are_validated(admin: httpx.Client, target: Target) -> None:
    ok(admin.post(target.path, json={"mode": "REQUIRE_APPROVAL"}))
    err(admin.post(target.path, json={"mode": "SOMETIMES"}), 400, "INVALID_ARGUMENT")
    empty = {"access": {"subject": A, "permissions": []}}
    err(admin.post(target.path + "/requested:add", json=empty), 400, "INVALID_ARGUMENT")
    other = {"resource": "organizations/elsewhere", "access": {"subject": A, "permissions": ["G"]}}
    body = err(admin.post(target.path + "/requested:add", json=other), 400, "INVALID_ARGUMENT")
    assert "resource" in body["message"]
    err(admin.post(target.path + "/approved:delete", json={}), 400, "INVALID_ARGUMENT")


def test_unknown_resource_is_not_found(admin: httpx.Client) -> None:
    path = f"/v2/organizations/{unique('nope')}/approvals"
    err(admin.post(path, json={"mode": "REQUIRE_APPROVAL"}), 404, "NOT_FOUND")
    err(admin.get(path), 404, "NOT_FOUND")


def test_every_transition_is_audited(admin: httpx.Client, org: str, target: Target) -> None:
    ok(admin.post(target.path, json={"mode": "REQUIRE_APPROVAL"}))
    for op in (
        ("request", A, ["GET"]),
        ("approve", A, ["GET"]),
        ("grant", B, ["GET"]),
        ("revoke", B),
        ("request", B, ["GET"]),
        ("withdraw", B),
    ):
        ok(run(admin, target, op))
    ok(admin.delete(target.path))
    err(run(admin, target, ("withdraw", A)), 404)  # refused: nothing to audit

    logs = ok(admin.get(f"/v2/organizations/{org}/auditlogs", params={"pageSize": 1000}))
    mine = [
        (e["operation"], e["properties"].get("subject"))
        for e in reversed(logs["auditLogs"])
        if e["kind"] == "ApprovalPolicy" and e["fqn"] == target.fqn
    ]
    assert mine == [
        ("SET_APPROVAL_POLICY", None),
        ("ADD_ACCESS_REQUEST", A),
        ("APPROVE_ACCESS_REQUEST", A),
        ("ADD_APPROVED_ACCESS", B),
        ("DELETE_APPROVED_ACCESS", B),
        ("ADD_ACCESS_REQUEST", B),
        ("DELETE_ACCESS_REQUEST", B),
        ("DELETE_APPROVAL_POLICY", None),
    ]


def test_query_lists_the_policies_of_the_organization_and_its_clusters(
    admin: httpx.Client, org: str
) -> None:
    base = f"/v2/organizations/{org}"
    for cluster in ("c1", "c2", "c3"):
        ok(admin.post(f"{base}/clusters", json={"name": cluster, "cluster": {}}))
    ok(admin.post(f"{base}/approvals", json={"mode": "ALLOW_REQUESTED"}))
    ok(admin.post(f"{base}/clusters/c1/approvals", json={"mode": "REQUIRE_APPROVAL"}))
    ok(admin.post(f"{base}/clusters/c3/approvals", json={"mode": "UNRESTRICTED"}))
    ok(run(admin, Target(f"organizations/{org}/clusters/c1"), ("grant", A, ["GET"])))

    everything = ok(admin.post(f"{base}/approvals/query", json={}))["policies"]
    assert [(p["resource"], p["mode"]) for p in everything] == [
        (f"organizations/{org}", "ALLOW_REQUESTED"),
        (f"organizations/{org}/clusters/c1", "REQUIRE_APPROVAL"),
        (f"organizations/{org}/clusters/c3", "UNRESTRICTED"),
    ]
    assert all("approved" not in p for p in everything)

    clusters = ok(
        admin.post(
            f"{base}/approvals/query",
            json={"parent": f"organizations/{org}", "types": ["Cluster"], "includeDetails": True},
        )
    )["policies"]
    assert [p["resource"].rsplit("/", 1)[1] for p in clusters] == ["c1", "c3"]
    assert clusters[0]["approved"] == [{"subject": A, "permissions": ["GET"]}]

    on_cluster = ok(
        admin.post(f"{base}/clusters/c1/approvals/query", json={"includePermissions": True})
    )["policies"]
    assert [p["resource"] for p in on_cluster] == [f"organizations/{org}/clusters/c1"]
    assert "CheckApprovalPolicyAccess" in on_cluster[0]["allowedOperations"]
