"""LDAP directory sync against a real, throwaway OpenLDAP slapd."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import ldap3  # type: ignore[import-untyped]
import pytest

from mgmt_api.identity.config import LdapSyncConfig
from mgmt_api.identity.secrets import SecretRef
from mgmt_api.identity.sync.ldap import LdapSource
from mgmt_api.identity.sync.model import DirectoryTeam, DirectoryUser
from mgmt_api.identity.sync.runner import DirectorySync
from mgmt_api.identity.sync.store import InMemoryDirectoryStore
from tests.identity.slapd_tls import TlsSlapd, start_tls_slapd
from tests.support.slapd import (
    GROUPS,
    PEOPLE,
    SIZE_LIMIT,
    SYNC_DN,
    SYNC_PASSWORD,
    Slapd,
    add_group,
    add_user,
)

ORG = "acme"


@pytest.fixture
def directory(slapd: Slapd) -> Iterator[ldap3.Connection]:
    """Seven users (more than the server's size limit for the sync account) and three groups."""
    conn = slapd.admin()
    users = {
        uid: add_user(conn, uid, mail=f"{uid}@example.test")
        for uid in ("alice", "bob", "carol", "dave", "erin", "frank", "grace")
    }
    assert len(users) > SIZE_LIMIT
    add_group(conn, "devs", [users["alice"], users["bob"]], description="Developers")
    add_group(conn, "ops", [users["carol"]])
    # Nested group, and a member DN written with different case and spacing.
    add_group(
        conn,
        "eng",
        ["cn=devs,ou=groups,dc=example,dc=test", "UID=Dave, OU=People,DC=example,DC=test"],
    )
    try:
        yield conn
    finally:
        for base in (GROUPS, PEOPLE):
            conn.search(
                base, "(|(objectClass=groupOfNames)(objectClass=inetOrgPerson))", ldap3.LEVEL
            )
            for entry in list(conn.entries):
                conn.delete(entry.entry_dn)
        conn.unbind()


def source(
    slapd: Slapd, tmp_path: Path, *, password: str = SYNC_PASSWORD, page_size: int = 3
) -> LdapSource:
    secret = tmp_path / "bind-password"
    secret.write_text(password)
    return LdapSource(
        LdapSyncConfig(
            url=slapd.url,
            bind_dn=SYNC_DN,
            bind_password=SecretRef("file", str(secret)),
            user_base=PEOPLE,
            group_base=GROUPS,
            page_size=page_size,
        )
    )


async def test_full_sync_creates_users_teams_and_exact_membership(
    slapd: Slapd, directory: ldap3.Connection, tmp_path: Path
) -> None:
    store = InMemoryDirectoryStore()
    result = await DirectorySync(ORG, source(slapd, tmp_path), store, interval_s=60).run_now()
    assert result.ok, result.error
    assert (result.users_created, result.teams_created) == (7, 3)
    snap = store.snapshot(ORG, "LDAP")
    assert [u.id for u in snap.users] == ["alice", "bob", "carol", "dave", "erin", "frank", "grace"]
    assert snap.users[0] == DirectoryUser(
        id="alice", login_name="alice", email="alice@example.test", display_name="Alice"
    )
    teams = {t.id: t for t in snap.teams}
    assert teams["devs"] == DirectoryTeam(
        id="devs",
        display_name="devs",
        description="Developers",
        member_user_ids=frozenset({"alice", "bob"}),
    )
    assert teams["eng"].member_user_ids == {"dave"}
    assert teams["eng"].member_team_ids == {"devs"}


async def test_resync_removes_what_disappeared_and_keeps_membership_exact(
    slapd: Slapd, directory: ldap3.Connection, tmp_path: Path
) -> None:
    store = InMemoryDirectoryStore()
    sync = DirectorySync(ORG, source(slapd, tmp_path), store, interval_s=60)
    assert (await sync.run_now()).ok

    directory.delete(f"uid=bob,{PEOPLE}")  # bob leaves: user removed, and from devs
    directory.delete(f"cn=ops,{GROUPS}")  # a team disappears
    directory.modify(
        f"cn=devs,{GROUPS}",
        {"member": [(ldap3.MODIFY_REPLACE, [f"uid=alice,{PEOPLE}", f"uid=erin,{PEOPLE}"])]},
    )
    directory.modify(
        f"uid=carol,{PEOPLE}", {"mail": [(ldap3.MODIFY_REPLACE, ["carol@new.example.test"])]}
    )

    result = await sync.run_now()
    assert result.ok, result.error
    assert (result.users_deleted, result.teams_deleted, result.users_updated) == (1, 1, 1)
    snap = store.snapshot(ORG, "LDAP")
    assert "bob" not in {u.id for u in snap.users}
    teams = {t.id: t for t in snap.teams}
    assert set(teams) == {"devs", "eng"}
    assert teams["devs"].member_user_ids == {"alice", "erin"}
    assert next(u for u in snap.users if u.id == "carol").email == "carol@new.example.test"

    # A third run with no change is a no-op.
    again = await sync.run_now()
    assert again.ok and again.users_created == again.users_updated == again.users_deleted == 0
    assert again.memberships_set == 0


async def test_without_paging_the_server_size_limit_would_truncate(
    slapd: Slapd, directory: ldap3.Connection
) -> None:
    """Guards the paging test above: the sync account really is limited per search."""
    conn = ldap3.Connection(
        ldap3.Server(slapd.url), user=SYNC_DN, password=SYNC_PASSWORD, auto_bind=True
    )
    conn.search(PEOPLE, "(objectClass=inetOrgPerson)", attributes=["uid"])
    assert conn.result["description"] == "sizeLimitExceeded"
    assert len(conn.entries) == SIZE_LIMIT
    conn.unbind()


async def test_a_failed_bind_keeps_the_last_good_state_and_reports(
    slapd: Slapd, directory: ldap3.Connection, tmp_path: Path
) -> None:
    store = InMemoryDirectoryStore()
    assert (await DirectorySync(ORG, source(slapd, tmp_path), store, interval_s=60).run_now()).ok
    before = store.snapshot(ORG, "LDAP")

    broken = DirectorySync(ORG, source(slapd, tmp_path, password="wrong"), store, interval_s=60)
    result = await broken.run_now()
    assert not result.ok
    assert result.error is not None and "bind" in result.error and "wrong" not in result.error
    assert store.snapshot(ORG, "LDAP") == before
    assert broken.last_result is result and broken.last_success is None


# ---- transport security (a real slapd with StartTLS and ldaps) -------------------------------


@pytest.fixture(scope="module")
def tls_slapd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsSlapd]:
    server = start_tls_slapd(tmp_path_factory.mktemp("tls"))
    conn = server.plain.admin()
    add_user(conn, "tina", mail="tina@example.test")
    conn.unbind()
    try:
        yield server
    finally:
        server.stop()


def tls_source(tmp_path: Path, url: str, *, start_tls: bool, ca_file: Path | None) -> LdapSource:
    secret = tmp_path / "bind-password"
    secret.write_text(SYNC_PASSWORD)
    return LdapSource(
        LdapSyncConfig(
            url=url,
            bind_dn=SYNC_DN,
            bind_password=SecretRef("file", str(secret)),
            user_base=PEOPLE,
            group_base=GROUPS,
            start_tls=start_tls,
            ca_file=str(ca_file) if ca_file else None,
        )
    )


@pytest.mark.parametrize("mode", ["start_tls", "ldaps"])
async def test_tls_connections_sync_when_the_certificate_verifies(
    tls_slapd: TlsSlapd, tmp_path: Path, mode: str
) -> None:
    url = tls_slapd.start_tls_url if mode == "start_tls" else tls_slapd.ldaps_url
    src = tls_source(tmp_path, url, start_tls=mode == "start_tls", ca_file=tls_slapd.ca_file)
    users, _ = await src.fetch()
    assert [u.id for u in users] == ["tina"]


@pytest.mark.parametrize("mode", ["start_tls", "ldaps"])
async def test_an_unverifiable_certificate_fails_the_run_before_the_bind(
    tls_slapd: TlsSlapd, tmp_path: Path, mode: str
) -> None:
    """ldap3 accepts any certificate by default; ours must not (here: signed by a CA we do
    not trust), and the run must fail as a read failure, changing nothing."""
    url = tls_slapd.start_tls_url if mode == "start_tls" else tls_slapd.ldaps_url
    src = tls_source(tmp_path, url, start_tls=mode == "start_tls", ca_file=tls_slapd.other_ca_file)
    store = InMemoryDirectoryStore()
    result = await DirectorySync(ORG, src, store, interval_s=60).run_now()
    assert not result.ok and result.applied_nothing, result.error
    assert "CERTIFICATE_VERIFY_FAILED" in (result.error or "")
    assert SYNC_PASSWORD not in (result.error or "")
    assert store.snapshot(ORG, "LDAP").users == ()
