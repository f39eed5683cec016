"""Deleting a user or team forgets it everywhere, by REST and by directory sync alike.

One table of the places a principal can be named (the root, RBAC,
organization, cluster and tenant access policies, and a manual team's
members), one rule checked for both write paths: after the delete no
policy and no team names it, each change is audited, and a principal
re-created under the same name starts with nothing. ``cleanupresources``
reports (and with ``apply=true`` removes) subjects left dangling by releases
before the rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.mgmt_api.harness import MgmtServer, err, ok, unique
from tests.mgmt_api.rbac_helpers import grant, policy_path

PASSWORD = "user-password-1"


def places(org: str) -> dict[str, str]:
    """Every kind of policy holder a binding can live on: name -> FQN."""
    o = f"organizations/{org}"
    return {
        "root": "",
        "rbac": "rbac",
        "organization": o,
        "cluster": f"{o}/clusters/c",
        "tenant": f"{o}/tenants/t",
    }


def build(admin: httpx.Client, org: str) -> None:
    o = f"organizations/{org}"
    ok(admin.post(f"/v2/{o}/clusters", json={"name": "c", "cluster": {}}))
    ok(admin.post(f"/v2/{o}/tenants", json={"name": "t", "tenant": {}}))
    ok(admin.post(f"/v2/{o}/teams", json={"name": "manual", "team": {}}))


def named_in(admin: httpx.Client, org: str, subject: str) -> list[str]:
    """The places whose policy names ``subject``, plus ``team`` if the manual team does."""
    out = [
        place
        for place, fqn in places(org).items()
        if subject in str(ok(admin.get(policy_path(fqn)))["allow"])
    ]
    team = ok(admin.get(f"/v2/organizations/{org}/teams/manual"))
    return out + (["team"] if subject in (team.get("members") or []) else [])


def bind_everywhere(admin: httpx.Client, org: str, key: str, subject: str) -> None:
    for fqn in places(org).values():
        grant(admin, fqn, "rbac/admin" if fqn == "" else "rbac/editor", {key: subject})
    if key == "user":
        team = ok(admin.get(f"/v2/organizations/{org}/teams/manual"))
        ok(
            admin.put(
                f"/v2/organizations/{org}/teams/manual",
                json={"etag": team["etag"], "members": [subject]},
            )
        )


def push(admin: httpx.Client, org: str, users: list[str], teams: list[str]) -> None:
    body = {
        "sourceType": "LDAP",
        "users": [{"id": u} for u in users],
        "teams": [{"id": t, "memberUserIds": []} for t in teams],
    }
    result = ok(admin.post(f"/v2/organizations/{org}:sync", json=body))
    assert result["ok"], result


# (the principal's collection and binding key, how it is created, how it is deleted)
OTHERS = ["keep-1", "keep-2", "keep-3"]  # so that the sync's deletion guard lets one go


def rest_create(admin: httpx.Client, org: str, collection: str, name: str) -> None:
    field = collection[:-1]
    ok(admin.post(f"/v2/organizations/{org}/{collection}", json={"name": name, field: {}}))


def rest_delete(admin: httpx.Client, org: str, collection: str, name: str) -> None:
    assert admin.delete(f"/v2/organizations/{org}/{collection}/{name}").status_code == 200


def sync_create(admin: httpx.Client, org: str, collection: str, name: str) -> None:
    push(admin, org, [name, *OTHERS], OTHERS) if collection == "users" else push(
        admin, org, OTHERS, [name, *OTHERS]
    )


def sync_delete(admin: httpx.Client, org: str, collection: str, name: str) -> None:
    push(admin, org, OTHERS, OTHERS)


PATHS: dict[str, tuple[Callable[..., None], Callable[..., None]]] = {
    "rest": (rest_create, rest_delete),
    "directory-sync": (sync_create, sync_delete),
}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize(("collection", "key"), [("users", "user"), ("teams", "team")])
def test_deleting_a_principal_removes_it_from_every_binding_and_team(
    server: MgmtServer, admin: httpx.Client, path: str, collection: str, key: str
) -> None:
    org = unique("forget")
    ok(admin.post("/v2/organizations", json={"name": org, "organization": {}}))
    build(admin, org)
    create, delete = PATHS[path]
    subject = f"organizations/{org}/{collection}/alice"
    create(admin, org, collection, "alice")
    bind_everywhere(admin, org, key, subject)
    expected = [*places(org), *(["team"] if key == "user" else [])]
    assert named_in(admin, org, subject) == expected

    delete(admin, org, collection, "alice")

    assert named_in(admin, org, subject) == []
    # Audited: the delete lists every policy it changed (the root's and rbac's records
    # are filed outside the organization), and each of the organization's has its own.
    logs = ok(admin.get(f"/v2/organizations/{org}/auditlogs", params={"pageSize": 1000}))
    logs = logs["auditLogs"]
    unbound = [
        log["fqn"]
        for log in logs
        if log["operation"] == "SET_POLICY" and subject in log["properties"].get("removed", [])
    ]
    assert sorted(unbound) == sorted(list(places(org).values())[2:])
    deleted = next(log for log in logs if log["fqn"] == subject and log["operation"] == "DELETE")
    assert sorted(deleted["properties"]["unboundFrom"]) == sorted(places(org).values())
    if key == "user":
        assert deleted["properties"]["removedFromTeams"] == [f"organizations/{org}/teams/manual"]

    # A principal re-created under the name starts with nothing.
    if key == "user":
        ok(
            admin.post(
                f"/v2/organizations/{org}/users",
                json={"name": "alice", "user": {"loginName": "alice", "password": PASSWORD}},
            )
        )
        with server.client(auth=(f"{org}/alice", PASSWORD)) as alice:
            for fqn in places(org).values():
                if fqn not in ("", "rbac"):
                    assert ok(alice.get(f"/v2/{fqn}/permissions"))["rules"] == []
    else:
        rest_create(admin, org, "teams", "alice")
        assert named_in(admin, org, subject) == []


def test_the_last_root_admin_cannot_be_deleted(server: MgmtServer, admin: httpx.Client) -> None:
    """The delete rule keeps the root policy's invariant, as a policy PUT does."""
    root = ok(admin.get(policy_path("")))
    name = unique("solo")
    ok(
        admin.post(
            "/v2/users", json={"name": name, "user": {"loginName": name, "password": PASSWORD}}
        )
    )
    solo = {"role": "rbac/admin", "subjects": [{"user": f"users/{name}"}]}
    ok(admin.put(policy_path(""), json={"etag": root["etag"], "allow": [solo]}))
    try:
        with server.client(auth=(name, PASSWORD)) as client:
            refused = err(client.delete(f"/v2/users/{name}"), 400)
        assert "root policy" in refused["message"]
    finally:
        with server.client(auth=(name, PASSWORD)) as client:
            current = ok(client.get(policy_path("")))
            ok(client.put(policy_path(""), json={"etag": current["etag"], "allow": root["allow"]}))
        assert admin.delete(f"/v2/users/{name}").status_code == 200


def test_cleanup_reports_and_removes_subjects_left_dangling(admin: httpx.Client) -> None:
    """Bindings and memberships naming principals that no longer exist (left by releases
    before the delete rule): reported by a dry run, removed with apply=true."""
    org = unique("dangle")
    ok(admin.post("/v2/organizations", json={"name": org, "organization": {}}))
    build(admin, org)
    ghost = f"organizations/{org}/users/ghost"
    gone_team = f"organizations/{org}/teams/gone"
    live = f"organizations/{org}/teams/manual"
    cluster = places(org)["cluster"]
    grant(admin, cluster, "rbac/editor", {"user": ghost})
    grant(admin, cluster, "rbac/reader", {"team": live})
    grant(admin, "rbac", "rbac/reader", {"team": gone_team})
    team = ok(admin.get(f"/v2/{live}"))
    ok(admin.put(f"/v2/{live}", json={"etag": team["etag"], "members": [ghost]}))

    def dangling(body: dict[str, Any]) -> list[tuple[str, str]]:
        return sorted(
            (c["fqn"], c["reason"]) for c in body["changes"] if c["reason"].startswith("deleted")
        )

    expected = sorted(
        [
            (ghost, f"deleted User still named in team {live}"),
            (ghost, f"deleted User still named in the access policy of {cluster}"),
            (gone_team, "deleted Team still named in the access policy of rbac"),
        ]
    )
    path = f"/v2/organizations/{org}/cleanupresources"
    assert dangling(ok(admin.post(path, json={}))) == expected
    assert dangling(ok(admin.post(path, json={"apply": True}))) == expected
    assert named_in(admin, org, ghost) == []
    assert gone_team not in str(ok(admin.get(policy_path("rbac")))["allow"])
    assert live in str(ok(admin.get(policy_path(cluster)))["allow"])  # the live team stays
    assert dangling(ok(admin.post(path, json={}))) == []
