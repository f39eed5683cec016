"""``POST /v2/organizations/{org}:sync`` on a real mgmt-api subprocess.

Pull sources: a real OpenLDAP ``slapd`` (tests/support/slapd.py) and the
Graph-shaped STAND-IN (tests/support/graph_server.py), because the real
Microsoft Graph cannot be reached from here. The server reads both through
its install config, as in production. Push: the ``SyncOrganization`` body
(reference notes), on a server without any directory configured.
"""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import ldap3  # type: ignore[import-untyped]
import pytest

from tests.identity.install_config import write_install_config
from tests.mgmt_api.harness import MgmtServer, err, ok, unique
from tests.support.graph_server import CLIENT_ID, CLIENT_SECRET, TENANT, GraphStandIn
from tests.support.slapd import (
    GROUPS,
    PEOPLE,
    SYNC_DN,
    SYNC_PASSWORD,
    Slapd,
    add_group,
    add_user,
    start_slapd,
)


@dataclass
class Synced:
    server: MgmtServer
    org: str
    secret: Path  # the directory credential file, read on every run


def create_org(server: MgmtServer, org: str) -> None:
    with server.admin() as admin:
        ok(admin.post("/v2/organizations", json={"name": org, "organization": {}}))


def sync(
    server: MgmtServer,
    org: str,
    auth: Any = None,
    body: dict[str, Any] | None = None,
    force: bool = False,
) -> httpx.Response:
    with server.client(auth=auth or ("admin", server.admin_password)) as client:
        return client.post(
            f"/v2/organizations/{org}:sync",
            json=body,
            params={"force": "true"} if force else None,
        )


@contextmanager
def synced_server(directory: Path, secret: Path, org: str, source: str) -> Iterator[Synced]:
    """A server whose install config syncs ``org`` from ``source`` (a YAML block)."""
    section = f"sync:\n  organizations: [{org}]\n" + textwrap.indent(source, "  ")
    server = MgmtServer(install_config=str(write_install_config(directory, section))).start()
    try:
        create_org(server, org)
        yield Synced(server, org, secret)
    finally:
        server.close()


def names(server: MgmtServer, org: str, collection: str) -> dict[str, dict[str, Any]]:
    with server.admin() as admin:
        items = ok(admin.get(f"/v2/organizations/{org}/{collection}"))[collection]
    return {item["fqn"].rsplit("/", 1)[1]: item for item in items}


# ---- LDAP (real slapd) --------------------------------------------------------------------


@pytest.fixture(scope="module")
def slapd() -> Iterator[Slapd]:
    server = start_slapd()
    conn = server.admin()
    alice = add_user(conn, "alice", mail="alice@example.test")
    bob = add_user(conn, "bob", mail="bob@example.test")
    carol = add_user(conn, "carol")
    add_group(conn, "devs", [alice, bob], description="Developers")
    add_group(conn, "eng", [f"cn=devs,{GROUPS}", carol])  # devs is nested in eng
    conn.unbind()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def ldap_synced(slapd: Slapd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synced]:
    directory = tmp_path_factory.mktemp("ldap-sync")
    secret = directory / "bind-password"
    secret.write_text(SYNC_PASSWORD)
    source = textwrap.dedent(
        f"""\
        ldap:
          url: {slapd.url}
          bindDn: {SYNC_DN}
          bindPassword: {{file: {secret}}}
          userBase: {PEOPLE}
          groupBase: {GROUPS}
          pageSize: 2
        """
    )
    with synced_server(directory, secret, unique("ldap"), source) as synced:
        yield synced


def test_sync_now_creates_the_directory_users_and_teams(ldap_synced: Synced) -> None:
    server, org = ldap_synced.server, ldap_synced.org
    body = ok(sync(server, org))
    assert body["ok"] is True and body["sourceType"] == "LDAP"
    assert body["users"]["created"] == 3 and body["teams"]["created"] == 2
    users = names(server, org, "users")
    assert {n for n, u in users.items() if u.get("sourceType") == "LDAP"} == {
        "alice",
        "bob",
        "carol",
    }
    assert users["alice"]["email"] == "alice@example.test"
    teams = names(server, org, "teams")
    assert teams["devs"]["members"] == [
        f"organizations/{org}/users/alice",
        f"organizations/{org}/users/bob",
    ]
    assert teams["devs"]["description"] == "Developers"
    assert teams["eng"]["members"] == [f"organizations/{org}/users/carol"]
    assert ok(sync(server, org))["users"] == {"created": 0, "updated": 0, "deleted": 0}


def test_nested_groups_give_their_grants_to_the_members_of_inner_teams(
    ldap_synced: Synced,
) -> None:
    server, org = ldap_synced.server, ldap_synced.org
    ok(sync(server, org))
    with server.admin() as admin:
        policy = ok(admin.get(f"/v2/organizations/{org}/policy"))
        policy["allow"].append(
            {"role": "rbac/reader", "subjects": [{"team": f"organizations/{org}/teams/eng"}]}
        )
        ok(admin.put(f"/v2/organizations/{org}/policy", json=policy))
        alice = ok(admin.get(f"/v2/organizations/{org}/users/alice"))
        ok(
            admin.put(
                f"/v2/organizations/{org}/users/alice",
                json={**alice, "password": "alice-local-password"},
            )
        )
    with server.client(auth=(f"{org}/alice", "alice-local-password")) as client:
        ok(client.get(f"/v2/organizations/{org}"))  # alice in devs, devs nested in eng


def test_a_full_sync_removes_what_left_the_directory_and_keeps_local_objects(
    ldap_synced: Synced, slapd: Slapd
) -> None:
    server, org = ldap_synced.server, ldap_synced.org
    ok(sync(server, org))
    local_members = [f"organizations/{org}/users/bob", f"organizations/{org}/users/local"]
    with server.admin() as admin:
        ok(admin.post(f"/v2/organizations/{org}/users", json={"name": "local", "user": {}}))
        ok(
            admin.post(
                f"/v2/organizations/{org}/teams",
                json={"name": "manual", "team": {"members": local_members}},
            )
        )
    conn = slapd.admin()
    conn.delete(f"uid=bob,{PEOPLE}")
    conn.modify(f"cn=devs,{GROUPS}", {"member": [(ldap3.MODIFY_REPLACE, [f"uid=alice,{PEOPLE}"])]})
    conn.unbind()
    try:
        body = ok(sync(server, org))
        assert body["users"]["deleted"] == 1 and body["teams"]["membershipsSet"] == 1
        users = names(server, org, "users")
        assert "bob" not in users and {"alice", "carol", "local"} <= set(users)
        teams = names(server, org, "teams")
        assert teams["devs"]["members"] == [f"organizations/{org}/users/alice"]
        assert teams["manual"]["members"] == [f"organizations/{org}/users/local"]
    finally:
        conn = slapd.admin()
        bob = add_user(conn, "bob", mail="bob@example.test")
        conn.modify(
            f"cn=devs,{GROUPS}",
            {"member": [(ldap3.MODIFY_REPLACE, [f"uid=alice,{PEOPLE}", bob])]},
        )
        conn.unbind()


def test_a_failed_read_keeps_the_last_good_state_and_is_reported(ldap_synced: Synced) -> None:
    server, org = ldap_synced.server, ldap_synced.org
    good = ok(sync(server, org))
    before = names(server, org, "users")
    ldap_synced.secret.write_text("not-the-password")  # read on every run
    try:
        body = err(sync(server, org), 503)
        assert body["details"][0]["metadata"]["reason"] == "directory_unavailable"
        assert "nothing was changed" in body["message"]
        assert "not-the-password" not in body["message"]
    finally:
        ldap_synced.secret.write_text(SYNC_PASSWORD)
    assert names(server, org, "users").keys() == before.keys()
    with server.admin() as admin:
        status = ok(admin.get(f"/v2/organizations/{org}/directorySync"))
    assert status["lastResult"]["ok"] is False
    assert status["lastSuccess"]["startedAt"] >= good["startedAt"]
    assert status["sourceType"] == "LDAP"


def test_sync_needs_its_own_permission_and_is_audited(ldap_synced: Synced) -> None:
    server, org = ldap_synced.server, ldap_synced.org
    with server.client() as anonymous:
        err(anonymous.post(f"/v2/organizations/{org}:sync"), 401)
    role = {"rules": [{"types": [{"kinds": ["DirectorySync"]}], "permissions": ["SET_POLICY"]}]}
    syncer, reader = unique("syncer"), unique("reader")
    with server.admin() as admin:
        ok(admin.post("/v2/rbac", json={"name": syncer, "role": role}))
        for user in (syncer, reader):
            ok(
                admin.post(
                    f"/v2/organizations/{org}/users",
                    json={"name": user, "user": {"password": f"{user}-password"}},
                )
            )
        policy = ok(admin.get(f"/v2/organizations/{org}/policy"))
        policy["allow"] += [
            {
                "role": f"rbac/{syncer}",
                "subjects": [{"user": f"organizations/{org}/users/{syncer}"}],
            },
            {"role": "rbac/editor", "subjects": [{"user": f"organizations/{org}/users/{reader}"}]},
        ]
        ok(admin.put(f"/v2/organizations/{org}/policy", json=policy))
    denied = err(sync(server, org, (f"{org}/{reader}", f"{reader}-password")), 403)
    assert "DirectorySync" in denied["message"]
    ok(sync(server, org, (f"{org}/{syncer}", f"{syncer}-password")))
    with server.admin() as admin:
        logs = ok(admin.get(f"/v2/organizations/{org}/auditlogs"))["auditLogs"]
    runs = [log for log in logs if log["operation"] == "SYNC"]
    assert runs[0]["triggeredBy"] == f"organizations/{org}/users/{syncer}"
    assert any(log["triggeredBy"] == "system:directory-sync" for log in logs)


def test_only_configured_organizations_can_be_synced(ldap_synced: Synced) -> None:
    server = ldap_synced.server
    other = unique("other")
    create_org(server, other)
    body = err(sync(server, other), 400)
    assert body["details"][0]["metadata"]["reason"] == "sync_not_configured"
    err(sync(server, unique("missing")), 404)


def test_without_oidc_the_login_endpoints_say_it_is_not_configured(ldap_synced: Synced) -> None:
    with ldap_synced.server.client() as anonymous:
        assert ok(anonymous.get("/v2/oidc/configuration"))["enabled"] is False
        body = err(anonymous.get("/v2/oidc/login"), 400)
        assert body["details"][0]["metadata"]["reason"] == "oidc_disabled"
        err(anonymous.post("/v2/oidc/token", data={"grant_type": "x"}), 400)


def test_the_periodic_job_syncs_at_start(ldap_synced: Synced, slapd: Slapd) -> None:
    """The job runs at start and then every ``interval``; a restart shows the first run."""
    server, org = ldap_synced.server, ldap_synced.org
    conn = slapd.admin()
    add_user(conn, "dave")
    conn.unbind()
    try:
        server.stop()
        server.start()
        deadline = time.monotonic() + 30
        while "dave" not in names(server, org, "users"):
            assert time.monotonic() < deadline, "the periodic sync never ran"
            time.sleep(0.1)
    finally:
        conn = slapd.admin()
        conn.delete(f"uid=dave,{PEOPLE}")
        conn.unbind()


# ---- Microsoft Graph (STAND-IN) -----------------------------------------------------------------


@pytest.fixture(scope="module")
def graph() -> Iterator[GraphStandIn]:
    with GraphStandIn() as server:
        server.set_directory(
            [
                {"id": f"u{i}", "userPrincipalName": f"user{i}@acme.test", "mail": None}
                for i in range(3)
            ],
            [{"id": "g-devs", "displayName": "Developers", "description": "All developers"}],
            {"g-devs": ["u0", "u1", "a-device"]},
        )
        yield server


@pytest.fixture(scope="module")
def graph_synced(graph: GraphStandIn, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synced]:
    directory = tmp_path_factory.mktemp("graph-sync")
    secret = directory / "graph-secret"
    secret.write_text(CLIENT_SECRET)
    source = textwrap.dedent(
        f"""\
        azure:
          clientId: {CLIENT_ID}
          tenantId: {TENANT}
          clientSecret: {{file: {secret}}}
          graphBaseUrl: {graph.base_url}
          authorityBaseUrl: {graph.base_url}
        """
    )
    with synced_server(directory, secret, unique("azure"), source) as synced:
        yield synced


def test_graph_sync_pages_through_throttling_into_users_and_teams(
    graph: GraphStandIn, graph_synced: Synced
) -> None:
    server, org = graph_synced.server, graph_synced.org
    graph.throttle("/v1.0/users", 1, status=429, retry_after="1")
    body = ok(sync(server, org))
    assert body["ok"] is True and body["sourceType"] == "AZURE"
    assert body["droppedReferences"] == 1  # the device is not a user
    users = names(server, org, "users")
    assert set(users) == {"u0", "u1", "u2"}
    assert users["u0"]["loginName"] == "user0@acme.test" and users["u0"]["sourceType"] == "AZURE"
    devs = names(server, org, "teams")["g-devs"]
    assert devs["displayName"] == "Developers"
    assert devs["members"] == [f"organizations/{org}/users/u0", f"organizations/{org}/users/u1"]


def test_graph_failure_mid_listing_changes_nothing(
    graph: GraphStandIn, graph_synced: Synced
) -> None:
    server, org = graph_synced.server, graph_synced.org
    ok(sync(server, org))
    graph.break_path("/v1.0/groups")
    try:
        err(sync(server, org), 503)
    finally:
        graph.state.broken_prefixes.clear()
    assert set(names(server, org, "users")) == {"u0", "u1", "u2"}
    assert "g-devs" in names(server, org, "teams")


# ---- push: the SyncOrganization body ------------------------------------------------------------


@pytest.fixture(scope="module")
def plain_server() -> Iterator[MgmtServer]:
    """No install config: other identity providers push their directory."""
    server = MgmtServer().start()
    try:
        yield server
    finally:
        server.close()


def directory(*user_ids: str, teams: dict[str, list[str]] | None = None) -> dict[str, Any]:
    return {
        "sourceType": "LDAP",
        "users": [{"id": u, "email": f"{u}@example.test", "displayName": u.title()}
                  for u in user_ids],
        "teams": [{"id": t, "displayName": t.upper(), "memberUserIds": members}
                  for t, members in (teams or {}).items()],
    }  # fmt: skip


def test_a_pushed_directory_is_a_full_sync_with_exact_teams(plain_server: MgmtServer) -> None:
    org = unique("push")
    create_org(plain_server, org)
    with plain_server.admin() as admin:
        ok(admin.post(f"/v2/organizations/{org}/users", json={"name": "local", "user": {}}))
    body = ok(
        sync(
            plain_server,
            org,
            body=directory("ann", "ben", "cat", "dan", teams={"ops": ["ann", "ben", "ghost"]}),
        )
    )
    assert body["ok"] and body["sourceType"] == "LDAP"
    assert body["users"]["created"] == 4 and body["droppedReferences"] == 1
    users = names(plain_server, org, "users")
    assert users["ann"]["sourceType"] == "LDAP" and users["ann"]["email"] == "ann@example.test"
    ops = names(plain_server, org, "teams")["ops"]
    assert ops["members"] == [f"organizations/{org}/users/ann", f"organizations/{org}/users/ben"]

    # Full sync: what the body leaves out is deleted; local objects are kept.
    body = ok(sync(plain_server, org, body=directory("ann", "ben", "cat", teams={"ops": ["cat"]})))
    assert body["users"]["deleted"] == 1 and body["teams"]["membershipsSet"] == 1
    assert set(names(plain_server, org, "users")) == {"ann", "ben", "cat", "local"}
    assert names(plain_server, org, "teams")["ops"]["members"] == [f"organizations/{org}/users/cat"]
    with plain_server.admin() as admin:
        status = ok(admin.get(f"/v2/organizations/{org}/directorySync"))
        logs = ok(admin.get(f"/v2/organizations/{org}/auditlogs"))["auditLogs"]
    assert status["sourceType"] == "LDAP" and status["lastResult"]["users"]["deleted"] == 1
    assert status["intervalSeconds"] is None
    pushes = [log for log in logs if log["operation"] == "SYNC"]
    assert pushes and "(push)" in pushes[0]["message"]


def test_an_empty_push_is_refused_unless_forced(plain_server: MgmtServer) -> None:
    """An empty "successful" listing would delete every synced user: refused, reported,
    nothing changed, until the caller confirms with force=true."""
    org = unique("empty")
    create_org(plain_server, org)
    ok(sync(plain_server, org, body=directory("ann", "ben", teams={"ops": ["ann"]})))
    refused = err(sync(plain_server, org, body=directory()), 400)
    assert refused["details"][0]["metadata"]["reason"] == "too_many_deletions"
    assert "2 of 2 synced users" in refused["message"] and "force" in refused["message"]
    assert {"ann", "ben"} <= set(names(plain_server, org, "users"))
    with plain_server.admin() as admin:
        status = ok(admin.get(f"/v2/organizations/{org}/directorySync"))
    assert status["lastResult"]["reason"] == "too_many_deletions"
    assert status["lastSuccess"]["users"]["created"] == 2
    forced = ok(sync(plain_server, org, body=directory(), force=True))
    assert forced["forced"] and forced["users"]["deleted"] == 2
    assert names(plain_server, org, "users") == {}


def test_a_push_reports_records_it_could_not_write(plain_server: MgmtServer) -> None:
    org = unique("partial")
    create_org(plain_server, org)
    with plain_server.admin() as admin:
        ok(admin.post(f"/v2/organizations/{org}/users", json={"name": "taken", "user": {}}))
    body = ok(sync(plain_server, org, body=directory("fine", "taken", "Not_A_Name")))
    assert body["ok"] is False and body["reason"] == "store_failures"
    assert sorted(body["failedUsers"]["addition"]) == ["Not_A_Name", "taken"]
    assert names(plain_server, org, "users")["taken"]["sourceType"] == "MANUAL"  # not taken over


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"users": []}, "sourceType"),
        ({"sourceType": "MANUAL"}, "sourceType"),
        ({"sourceType": "LDAP", "users": [{"email": "x@y"}]}, "id"),
        ({"sourceType": "LDAP", "groups": []}, "groups"),
        ({"sourceType": "LDAP", "fqn": "organizations/someone-else"}, "fqn"),
    ],
)
def test_a_malformed_push_is_refused_before_anything_is_written(
    plain_server: MgmtServer, body: dict[str, Any], field: str
) -> None:
    org = unique("bad")
    create_org(plain_server, org)
    refused = err(sync(plain_server, org, body=body), 400)
    assert field in json.dumps(refused)
    assert names(plain_server, org, "users") == {}


def test_push_needs_the_sync_permission(plain_server: MgmtServer) -> None:
    org = unique("perm")
    create_org(plain_server, org)
    reader = unique("reader")
    with plain_server.admin() as admin:
        ok(
            admin.post(
                f"/v2/organizations/{org}/users",
                json={"name": reader, "user": {"password": f"{reader}-password"}},
            )
        )
        policy = ok(admin.get(f"/v2/organizations/{org}/policy"))
        policy["allow"].append(
            {"role": "rbac/editor", "subjects": [{"user": f"organizations/{org}/users/{reader}"}]}
        )
        ok(admin.put(f"/v2/organizations/{org}/policy", json=policy))
    with plain_server.client() as anonymous:
        err(anonymous.post(f"/v2/organizations/{org}:sync", json=directory("x")), 401)
    denied = err(sync(plain_server, org, (f"{org}/{reader}", f"{reader}-password"),
                      body=directory("x")), 403)  # fmt: skip
    assert "DirectorySync" in denied["message"]
    # Without a body there is nothing configured to pull from.
    unconfigured = err(sync(plain_server, org), 400)
    assert unconfigured["details"][0]["metadata"]["reason"] == "sync_not_configured"


def test_pushing_the_source_an_organization_is_pulled_from_is_refused(
    ldap_synced: Synced,
) -> None:
    server, org = ldap_synced.server, ldap_synced.org
    refused = err(sync(server, org, body=directory("intruder")), 400)
    assert refused["details"][0]["metadata"]["reason"] == "source_is_pulled"
    assert "intruder" not in names(server, org, "users")
    pushed = ok(sync(server, org, body={**directory("az-user"), "sourceType": "AZURE"}))
    try:
        assert pushed["users"]["created"] == 1
    finally:
        ok(sync(server, org, body={"sourceType": "AZURE"}, force=True))
