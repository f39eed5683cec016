"""LDAP as a directory source (ldap3, paged searches, member attributes).

Users are the entries under ``userBase`` matching ``userFilter``; teams are
the entries under ``groupBase`` matching ``groupFilter``, whose ``member``
attribute lists DNs. A member DN is resolved to a user (or, for nested
groups, a team) of the same listing; DNs are compared after normalization
(case and spacing), because servers return them as they were written.

Searches use the simple paged results control (RFC 2696) so a large
directory does not hit the server's size limit. ldap3 is synchronous, so the
whole read runs in a worker thread. The connection is read-only and uses
the bind password only for the bind.

Transport security: the bind password and the whole directory cross the
connection, so it is encrypted unless it stays on this machine. The config
refuses ``ldap://`` to a non-loopback address without ``startTls: true``;
``ldaps://`` and StartTLS (RFC 4511 4.14, before the bind) both verify the
server certificate and its host name against the system CAs or ``caFile``
(ldap3 would otherwise accept any certificate). A failed StartTLS fails the
run before the password is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import ldap3  # type: ignore[import-untyped]
from ldap3.core.exceptions import LDAPException  # type: ignore[import-untyped]
from ldap3.utils.dn import safe_dn  # type: ignore[import-untyped]

from mgmt_api.identity.config import LdapAttributes, LdapSyncConfig
from mgmt_api.identity.secrets import SecretUnavailableError
from mgmt_api.identity.sync.model import DirectoryTeam, DirectoryUser
from mgmt_api.identity.sync.runner import SourceError


def normalize_dn(dn: str) -> str:
    """A comparable form of a DN: RFC 4514 spacing, lower case."""
    try:
        return str(safe_dn(dn)).lower()
    except LDAPException:
        return dn.strip().lower()


def _describe(exc: LDAPException) -> str:
    """The exception's class and ldap3's message (which names TLS and socket problems and
    never holds the bind password), clipped."""
    text = str(exc).strip()
    return f"{exc.__class__.__name__}: {text[:300]}" if text else exc.__class__.__name__


@dataclass(frozen=True, slots=True)
class LdapEntry:
    """One search result: its DN and its attributes as ldap3 returns them.

    Values stay ``object``: ldap3 gives a string, bytes or a list of them
    depending on the schema it knows, so :func:`_first` and :func:`_all`
    look at each one.
    """

    dn: str
    attributes: Mapping[str, object]


def _first(attributes: Mapping[str, object], name: str) -> str | None:
    value = attributes.get(name)
    if isinstance(value, list):
        value = value[0] if value else None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value) if value not in (None, "") else None


def _all(attributes: Mapping[str, object], name: str) -> list[str]:
    value = attributes.get(name)
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in values]


class LdapSource:
    """Users and groups of one LDAP directory."""

    source_type = "LDAP"

    def __init__(self, config: LdapSyncConfig) -> None:
        self.config = config

    async def fetch(self) -> tuple[list[DirectoryUser], list[DirectoryTeam]]:
        return await asyncio.to_thread(self._fetch_blocking)

    def _search(
        self, conn: Any, base: str, search_filter: str, attributes: list[str]
    ) -> list[LdapEntry]:
        entries = conn.extend.standard.paged_search(
            search_base=base,
            search_filter=search_filter,
            search_scope=ldap3.SUBTREE,
            attributes=attributes,
            paged_size=self.config.page_size,
            generator=False,
        )
        if conn.result and conn.result.get("result", 0) != 0:
            raise SourceError(
                f"LDAP search under {base} failed: {conn.result.get('description', 'error')}"
            )
        return [
            LdapEntry(str(e["dn"]), e.get("attributes") or {})
            for e in entries
            if e.get("type") == "searchResEntry"
        ]

    def _start_tls(self, conn: Any) -> None:
        """Upgrade to TLS before anything else is sent; fail the run when that is refused."""
        try:
            conn.open()
            started = conn.start_tls()
        except LDAPException as exc:
            raise SourceError(
                f"StartTLS with {self.config.url} failed, the bind password was not sent: "
                f"{_describe(exc)}"
            ) from exc
        if not started:
            raise SourceError(
                f"StartTLS with {self.config.url} failed, the bind password was not sent: "
                f"{(conn.result or {}).get('description', 'error')}"
            )

    def _fetch_blocking(self) -> tuple[list[DirectoryUser], list[DirectoryTeam]]:
        conn = self._connection()
        try:
            try:
                user_entries, group_entries = self._entries(conn)
            finally:
                with contextlib.suppress(LDAPException):  # must not mask the real failure
                    conn.unbind()
        except LDAPException as exc:
            raise SourceError(f"LDAP error talking to {self.config.url}: {_describe(exc)}") from exc
        attrs = self.config.attributes
        users, user_by_dn = _users(user_entries, attrs)
        return users, _teams(group_entries, attrs, user_by_dn)

    def _connection(self) -> Any:
        """An unbound connection to the directory, TLS-verified when the URL or config asks."""
        cfg = self.config
        try:
            password = cfg.bind_password.read().reveal()
        except SecretUnavailableError as exc:
            raise SourceError(f"cannot read the LDAP bind password: {exc}") from exc
        tls = None
        if cfg.start_tls or cfg.url.startswith("ldaps://"):
            # ldap3 checks the host name itself after the handshake (check_hostname).
            tls = ldap3.Tls(validate=ssl.CERT_REQUIRED, ca_certs_file=cfg.ca_file)
        server = ldap3.Server(
            cfg.url, connect_timeout=max(int(cfg.timeout_s), 1), get_info=ldap3.NONE, tls=tls
        )
        try:
            return ldap3.Connection(
                server,
                user=cfg.bind_dn,
                password=password,
                read_only=True,
                receive_timeout=max(int(cfg.timeout_s), 1),  # ldap3 packs it as an int
                raise_exceptions=False,
            )
        except LDAPException as exc:
            raise SourceError(f"LDAP error talking to {cfg.url}: {_describe(exc)}") from exc

    def _entries(self, conn: Any) -> tuple[list[LdapEntry], list[LdapEntry]]:
        """Bind (after StartTLS when configured) and read the user and group entries."""
        cfg = self.config
        attrs = cfg.attributes
        if cfg.start_tls:
            self._start_tls(conn)
        if not conn.bind():
            raise SourceError(
                f"LDAP bind as {cfg.bind_dn} failed: {conn.result.get('description', 'error')}"
            )
        user_entries = self._search(
            conn,
            cfg.user_base,
            cfg.user_filter,
            sorted({attrs.user_id, attrs.login_name, attrs.email, attrs.display_name}),
        )
        group_entries = self._search(
            conn,
            cfg.group_base,
            cfg.group_filter,
            sorted(
                {
                    attrs.group_id,
                    attrs.group_display_name,
                    attrs.group_description,
                    attrs.member,
                }
            ),
        )
        return user_entries, group_entries


def _users(
    entries: list[LdapEntry], attrs: LdapAttributes
) -> tuple[list[DirectoryUser], dict[str, str]]:
    """The directory's users, and their ids by normalized DN (to resolve group members)."""
    users: list[DirectoryUser] = []
    user_by_dn: dict[str, str] = {}
    for entry in entries:
        a = entry.attributes
        uid = _first(a, attrs.user_id)
        if uid is None:
            continue
        users.append(
            DirectoryUser(
                id=uid,
                login_name=_first(a, attrs.login_name) or uid,
                email=_first(a, attrs.email),
                display_name=_first(a, attrs.display_name),
            )
        )
        user_by_dn[normalize_dn(entry.dn)] = uid
    return users, user_by_dn


def _teams(
    entries: list[LdapEntry], attrs: LdapAttributes, user_by_dn: dict[str, str]
) -> list[DirectoryTeam]:
    """The directory's groups as teams; a member DN is a user, a nested group, or ignored."""
    group_by_dn: dict[str, str] = {}
    for entry in entries:
        gid = _first(entry.attributes, attrs.group_id)
        if gid is not None:
            group_by_dn[normalize_dn(entry.dn)] = gid
    teams: list[DirectoryTeam] = []
    for entry in entries:
        a = entry.attributes
        gid = _first(a, attrs.group_id)
        if gid is None:
            continue
        member_users: set[str] = set()
        member_groups: set[str] = set()
        for dn in _all(a, attrs.member):
            key = normalize_dn(dn)
            if key in user_by_dn:
                member_users.add(user_by_dn[key])
            elif key in group_by_dn:
                member_groups.add(group_by_dn[key])
        teams.append(
            DirectoryTeam(
                id=gid,
                display_name=_first(a, attrs.group_display_name),
                description=_first(a, attrs.group_description),
                member_user_ids=frozenset(member_users),
                member_team_ids=frozenset(member_groups),
            )
        )
    return teams
