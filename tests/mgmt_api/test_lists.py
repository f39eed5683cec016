"""Paging, label selection and the audit log."""

from __future__ import annotations

import httpx

from tests.mgmt_api.harness import err, ok


def test_paging_and_labels(admin: httpx.Client, org: str) -> None:
    base = f"/v2/organizations/{org}/clusters"
    for i in range(7):
        ok(
            admin.post(
                base,
                json={"name": f"c{i}", "cluster": {"labels": {"env": "prod" if i % 2 else "dev"}}},
            )
        )
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        page = ok(admin.get(base, params={"pageSize": 3, "pageToken": token}))
        seen += [c["fqn"].rsplit("/", 1)[1] for c in page["clusters"]]
        pages += 1
        token = page["nextPageToken"]
        if not token:
            break
    assert seen == [f"c{i}" for i in range(7)] and pages == 3
    prod = ok(admin.get(base, params={"labelSelector": "env=prod", "pageSize": 2}))
    assert [c["fqn"][-2:] for c in prod["clusters"]] == ["c1", "c3"]
    rest = ok(
        admin.get(
            base,
            params={"labelSelector": "env=prod", "pageSize": 2, "pageToken": prod["nextPageToken"]},
        )
    )
    assert [c["fqn"][-2:] for c in rest["clusters"]] == ["c5"] and rest["nextPageToken"] == ""
    assert len(ok(admin.get(base, params={"labelSelector": "env"}))["clusters"]) == 7
    assert ok(admin.get(base, params={"labelSelector": "team=x"}))["clusters"] == []
    err(admin.get(base, params={"pageToken": "!!!"}), 400)
    err(admin.get(base, params={"pageSize": 0}), 400)
    err(admin.get("/v2/organizations/missing-org/clusters"), 404)


def test_audit_log_records_who_did_what(admin: httpx.Client, org: str) -> None:
    base = f"/v2/organizations/{org}"
    ok(admin.post(f"{base}/tenants", json={"name": "t", "tenant": {}}))
    t = ok(admin.get(f"{base}/tenants/t"))
    ok(admin.put(f"{base}/tenants/t", json={**t, "displayName": "T"}))
    ok(admin.delete(f"{base}/tenants/t"))
    logs = ok(admin.get(f"{base}/auditlogs"))["auditLogs"]
    ops = [(entry["operation"], entry["fqn"]) for entry in logs[:3]]
    assert ops == [
        ("DELETE", f"{base[4:]}/tenants/t"),
        ("UPDATE", f"{base[4:]}/tenants/t"),
        ("CREATE", f"{base[4:]}/tenants/t"),
    ]
    assert all(entry["triggeredBy"] == "users/admin" for entry in logs)
    first = ok(admin.get(f"{base}/auditlogs", params={"pageSize": 1}))
    second = ok(
        admin.get(f"{base}/auditlogs", params={"pageSize": 1, "pageToken": first["nextPageToken"]})
    )
    assert first["auditLogs"][0]["id"] != second["auditLogs"][0]["id"]
