"""Name search on list endpoints and audit-log filters (added for the console).

Both stores, through the real server: ``nameContains`` keeps paging by FQN
and composes with RBAC filtering; the audit filters combine.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from tests.mgmt_api.harness import err, ok


def _names(body: dict[str, object], field: str) -> list[str]:
    return [str(c["fqn"]).rsplit("/", 1)[-1] for c in body[field]]  # type: ignore[attr-defined]


def test_name_search_pages_through_the_matches_only(admin: httpx.Client, org: str) -> None:
    for name in ("east-1", "east-2", "west-1", "east-3", "north"):
        ok(admin.post(f"/v2/organizations/{org}/clusters", json={"name": name, "cluster": {}}))
    url = f"/v2/organizations/{org}/clusters"
    first = ok(admin.get(url, params={"nameContains": "east", "pageSize": 2}))
    assert _names(first, "clusters") == ["east-1", "east-2"]
    assert first["nextPageToken"]
    rest = ok(
        admin.get(
            url, params={"nameContains": "east", "pageSize": 2, "pageToken": first["nextPageToken"]}
        )
    )
    assert _names(rest, "clusters") == ["east-3"]
    assert rest["nextPageToken"] == ""
    assert _names(ok(admin.get(url, params={"nameContains": "-1"})), "clusters") == [
        "east-1",
        "west-1",
    ]
    assert ok(admin.get(url, params={"nameContains": "nowhere"}))["clusters"] == []
    # Only name characters: a LIKE wildcard is a 400 naming the parameter.
    assert "nameContains" in err(admin.get(url, params={"nameContains": "%"}), 400)["message"]


def test_name_search_shows_only_what_the_caller_may_read(
    admin: httpx.Client, org: str, make_user: Callable[..., httpx.Client]
) -> None:
    for name in ("shop-a", "shop-b"):
        ok(admin.post(f"/v2/organizations/{org}/clusters", json={"name": name, "cluster": {}}))
    user = make_user(org, "reader")
    fqn = f"organizations/{org}/clusters/shop-b"
    policy = ok(admin.get(f"/v2/{fqn}/policy"))
    policy["allow"] = [
        {"role": "rbac/reader", "subjects": [{"user": f"organizations/{org}/users/reader"}]}
    ]
    ok(admin.put(f"/v2/{fqn}/policy", json=policy))
    found = ok(user.get(f"/v2/organizations/{org}/clusters", params={"nameContains": "shop"}))
    assert _names(found, "clusters") == ["shop-b"]


def test_audit_filters_combine(admin: httpx.Client, org: str) -> None:
    base = f"/v2/organizations/{org}"
    ok(admin.post(f"{base}/clusters", json={"name": "c1", "cluster": {}}))
    ok(admin.post(f"{base}/tenants", json={"name": "t1", "tenant": {}}))
    cluster = ok(admin.get(f"{base}/clusters/c1"))
    ok(admin.put(f"{base}/clusters/c1", json={"etag": cluster["etag"], "description": "x"}))
    url = f"{base}/auditlogs"
    by_kind = ok(admin.get(url, params={"kind": "Cluster"}))["auditLogs"]
    assert {r["operation"] for r in by_kind} == {"CREATE", "UPDATE"}
    assert all(r["kind"] == "Cluster" for r in by_kind)
    updates = ok(admin.get(url, params={"kind": "Cluster", "operation": "UPDATE"}))["auditLogs"]
    assert [r["fqn"] for r in updates] == [f"organizations/{org}/clusters/c1"]
    below = ok(admin.get(url, params={"fqnPrefix": f"organizations/{org}/tenants"}))["auditLogs"]
    assert {r["fqn"] for r in below} == {f"organizations/{org}/tenants/t1"}
    mine = ok(admin.get(url, params={"triggeredBy": "users/admin", "pageSize": 1}))
    assert len(mine["auditLogs"]) == 1 and mine["nextPageToken"]
    assert ok(admin.get(url, params={"triggeredBy": "users/nobody"}))["auditLogs"] == []
