"""The login rules as pure logic: the failed-login throttle, the client address
behind trusted proxies, and one password verification per attempt.

Tables over :class:`mgmt_api.domain.throttle.LoginThrottle` and
:func:`mgmt_api.domain.client_address.client_address` (the clock is an
argument), then the authenticator on the real store schema (SQLite), counting
the real Argon2 verifier's calls. Through a real Envoy:
tests/mgmt_api/test_login_behind_proxy.py.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mgmt_api.auth import passwords
from mgmt_api.domain.client_address import (
    MAX_HEADER_BYTES,
    MAX_HOPS,
    ForwardedHeader,
    client_address,
    parse_forwarded_header,
    parse_trusted_proxies,
)
from mgmt_api.domain.throttle import LoginThrottle, ThrottleRule
from mgmt_api.errors import ApiError, Code
from mgmt_api.service.authn import Authenticator
from mgmt_api.service.bootstrap import bootstrap
from mgmt_api.store import repo
from mgmt_api.store.engine import create_engine, migrate, write_tx
from mgmt_api.store.uow import UnitOfWork

# ---- the throttle ------------------------------------------------------------------------------

A, B, C = "10.0.0.1", "10.0.0.2", "10.0.0.3"
# (source, login, time) of each failure, then (source, login, time, expected wait).
Fail = tuple[str, str, float]
Check = tuple[str, str, float, float]


def _fails(source: str, login: str, count: int, at: float = 0.0) -> list[Fail]:
    return [(source, login, at)] * count


THROTTLE_CASES: list[tuple[str, list[Fail], list[Check]]] = [
    ("five failures are free", _fails(A, "admin", 5), [(A, "admin", 0, 0)]),
    ("the sixth locks 1 s", _fails(A, "admin", 6), [(A, "admin", 0, 1), (A, "admin", 1, 0)]),
    ("then 2 s, 4 s", _fails(A, "admin", 8), [(A, "admin", 0, 4), (A, "admin", 3.5, 0.5)]),
    ("capped at 300 s", _fails(A, "admin", 40), [(A, "admin", 0, 300)]),
    (
        "another address is never locked by A's failures",
        _fails(A, "admin", 40),
        [(B, "admin", 0, 0), (A, "alice", 0, 0)],
    ),
    (
        "the window ends a count",
        _fails(A, "admin", 6),
        [(A, "admin", 301, 0)],
    ),
    (
        "100 failures across logins lock the address for every login",
        [(A, f"user{i}", 0) for i in range(101)],
        [(A, "fresh-login", 0, 1), (B, "fresh-login", 0, 0)],
    ),
    (
        "99 across logins do not",
        [(A, f"user{i}", 0) for i in range(100)],
        [(A, "fresh-login", 0, 0)],
    ),
    (
        "a login under attack: a source that failed at it has no free failure left",
        [(f"10.1.0.{i}", "admin", 0.0) for i in range(20)] + [(C, "admin", 10)],
        [(C, "admin", 10, 1), (C, "admin", 10.5, 0.5), (C, "admin", 11, 0)],
    ),
    (
        "a login under attack: an address that has not failed is not refused",
        [(f"10.1.0.{i}", "admin", 0) for i in range(200)],
        [(B, "admin", 0, 0)],
    ),
    (
        "19 failures are not an attack",
        [(f"10.1.0.{i}", "admin", 0.0) for i in range(18)] + [(C, "admin", 0)],
        [(C, "admin", 0, 0)],
    ),
    (
        "under attack, a source's lock-out grows with its own failures",
        [(f"10.1.0.{i}", "admin", 0.0) for i in range(20)] + _fails(C, "admin", 3, 5),
        [(C, "admin", 5, 4)],
    ),
]


@pytest.mark.parametrize(
    ("fails", "checks"),
    [(f, c) for _, f, c in THROTTLE_CASES],
    ids=[n for n, _, _ in THROTTLE_CASES],
)
def test_throttle_rule(fails: list[Fail], checks: list[Check]) -> None:
    throttle = LoginThrottle(ThrottleRule())
    for source, login, at in fails:
        throttle.failure(source, login, at)
    for source, login, at, wait in checks:
        assert throttle.retry_after(source, login, at) == pytest.approx(wait), (source, login, at)


@pytest.mark.parametrize(
    ("first", "failures", "wait"),
    [(60, 5, 0), (60, 6, 60), (60, 8, 240), (60, 9, 300), (600, 6, 600), (600, 7, 600)],
)
def test_the_first_lockout_is_configurable(first: float, failures: int, wait: float) -> None:
    throttle = LoginThrottle(ThrottleRule.with_first_lockout(first))
    for _ in range(failures):
        throttle.failure(A, "admin", 0)
    assert throttle.retry_after(A, "admin", 0) == wait


def test_a_success_clears_the_pair_but_not_the_address_or_the_login() -> None:
    throttle = LoginThrottle(ThrottleRule())
    for _ in range(6):
        throttle.failure(A, "admin", 0)
    for i in range(95):
        throttle.failure(A, f"user{i}", 0)  # A: 101 failures in all
    for i in range(20):
        throttle.failure(f"10.1.0.{i}", "bob", 0)  # bob under attack
    throttle.failure(B, "bob", 0)
    throttle.success(A, "admin")
    throttle.success(B, "bob")
    assert throttle.retry_after(A, "admin", 0.5) == pytest.approx(0.5)  # A's own count goes on
    assert throttle.retry_after(B, "bob", 0) == 0  # B's failure at bob is forgiven
    throttle.failure(B, "bob", 1)
    assert throttle.retry_after(B, "bob", 1) == 1  # bob is still under attack


def test_throttle_tables_are_bounded_and_keyed_by_digest() -> None:
    throttle = LoginThrottle(ThrottleRule(), max_keys=3)
    for i in range(10):
        throttle.failure(A, "x" * 100_000 + str(i), 0)
    assert len(throttle.pairs) == 3 and len(throttle.logins) == 3 and len(throttle.sources) == 1
    assert all(len(key) == 16 for key in throttle.pairs._entries)


# ---- the client address ------------------------------------------------------------------------

PROXY = "10.9.0.1"
TRUSTED = parse_trusted_proxies("10.9.0.0/24, 192.168.7.7, fd00::/8")
V6 = "2001:db8:cafe::17"
X: ForwardedHeader = "x-forwarded-for"
F: ForwardedHeader = "forwarded"
OVERSIZED = "1.1.1.1," * (MAX_HEADER_BYTES // 8) + "1.2.3.4"
LONG_CHAIN = ", ".join(["1.2.3.4"] + ["10.9.0.9"] * MAX_HOPS)
LONGEST_CHAIN = ", ".join(["1.2.3.4"] + ["10.9.0.9"] * (MAX_HOPS - 1))

# (peer, header, its lines, trusted, expected client)
ADDRESS_CASES: list[tuple[str, str, ForwardedHeader, list[str], Any, str]] = [
    ("nothing trusted: the peer", "203.0.113.9", X, ["1.2.3.4"], (), "203.0.113.9"),
    ("an untrusted peer's XFF is ignored", "203.0.113.9", X, ["1.2.3.4"], TRUSTED, "203.0.113.9"),
    ("trusted peer: its XFF", PROXY, X, ["1.2.3.4"], TRUSTED, "1.2.3.4"),
    ("what the client wrote is skipped", PROXY, X, ["6.6.6.6, 1.2.3.4"], TRUSTED, "1.2.3.4"),
    ("trusted hops are skipped", PROXY, X, ["1.2.3.4, 10.9.0.8"], TRUSTED, "1.2.3.4"),
    ("all hops trusted: the left-most", PROXY, X, ["10.9.0.7, 10.9.0.8"], TRUSTED, "10.9.0.7"),
    ("a trusted peer without headers", PROXY, X, [], TRUSTED, PROXY),
    ("lines of one header join", PROXY, X, ["6.6.6.6", "1.2.3.4"], TRUSTED, "1.2.3.4"),
    ("garbage left of the client is never read", PROXY, X, ["<x>,,1.2.3.4"], TRUSTED, "1.2.3.4"),
    ("a malformed hop reached: the peer", PROXY, X, ["1.2.3.4, nonsense"], TRUSTED, PROXY),
    ("an empty hop reached: the peer", PROXY, X, ["1.2.3.4,"], TRUSTED, PROXY),
    ("IPv4 with a port", PROXY, X, ["1.2.3.4:5678"], TRUSTED, "1.2.3.4"),
    ("IPv6", PROXY, X, ["2001:db8::1"], TRUSTED, "2001:db8::1"),
    ("IPv6 in brackets with a port", PROXY, X, ["[2001:db8::1]:443"], TRUSTED, "2001:db8::1"),
    ("a bad port: the peer", PROXY, X, ["1.2.3.4:http"], TRUSTED, PROXY),
    ("IPv4-mapped IPv6 is IPv4", PROXY, X, ["::ffff:1.2.3.4"], TRUSTED, "1.2.3.4"),
    ("a mapped peer is normalized", "::ffff:127.0.0.2", X, [], (), "127.0.0.2"),
    ("a trusted IPv6 proxy", "fd00::5", X, ["1.2.3.4"], TRUSTED, "1.2.3.4"),
    ("a single trusted address", "192.168.7.7", X, ["1.2.3.4"], TRUSTED, "1.2.3.4"),
    ("its neighbour is not trusted", "192.168.7.8", X, ["1.2.3.4"], TRUSTED, "192.168.7.8"),
    ("no peer address at all", "unix-socket", X, ["1.2.3.4"], TRUSTED, "unix-socket"),
    ("Forwarded", PROXY, F, ["for=192.0.2.60;proto=http;by=203.0.113.43"], TRUSTED, "192.0.2.60"),
    ("Forwarded, quoted IPv6", PROXY, F, [f'for="[{V6}]:4711"'], TRUSTED, V6),
    ("Forwarded, right-most", PROXY, F, ["for=6.6.6.6,For=1.2.3.4;a=b"], TRUSTED, "1.2.3.4"),
    ("Forwarded, trusted hop skipped", PROXY, F, ["for=1.2.3.4,for=10.9.0.3"], TRUSTED, "1.2.3.4"),
    ("Forwarded, unknown: the peer", PROXY, F, ["for=unknown"], TRUSTED, PROXY),
    ("Forwarded, obfuscated: the peer", PROXY, F, ["for=_hidden"], TRUSTED, PROXY),
    ("Forwarded, no for=: the peer", PROXY, F, ["proto=https"], TRUSTED, PROXY),
    ("Forwarded, not key=value: the peer", PROXY, F, ["1.2.3.4"], TRUSTED, PROXY),
    ("Forwarded, unterminated quote: the peer", PROXY, F, ['for="1.2.3.4'], TRUSTED, PROXY),
    ("Forwarded, junk left of the client", PROXY, F, ["%%%, for=1.2.3.4"], TRUSTED, "1.2.3.4"),
    ("an oversized header: the peer", PROXY, X, [OVERSIZED], TRUSTED, PROXY),
    ("too many trusted hops: the peer", PROXY, X, [LONG_CHAIN], TRUSTED, PROXY),
    ("just enough trusted hops", PROXY, X, [LONGEST_CHAIN], TRUSTED, "1.2.3.4"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("peer", "header", "lines", "trusted", "expected"),
    [case[1:] for case in ADDRESS_CASES],
    ids=[case[0] for case in ADDRESS_CASES],
)
def test_client_address(
    peer: str, header: ForwardedHeader, lines: list[str], trusted: Any, expected: str
) -> None:
    assert client_address(peer, lines, trusted, header) == expected


def test_the_forwarded_header_is_one_of_two() -> None:
    assert parse_forwarded_header(" X-Forwarded-For") == "x-forwarded-for"
    assert parse_forwarded_header("Forwarded") == "forwarded"
    with pytest.raises(ValueError, match="'x-real-ip' is neither"):
        parse_forwarded_header("x-real-ip")


def test_trusted_proxies_parse_addresses_and_cidrs() -> None:
    assert parse_trusted_proxies("") == ()
    assert parse_trusted_proxies(" 10.0.0.0/8,127.0.0.1  ::1 ") == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("127.0.0.1/32"),
        ipaddress.ip_network("::1/128"),
    )


@pytest.mark.parametrize("text", ["10.0.0.1/8", "proxy.example", "10.0.0.0/33", "1.2.3"])
def test_bad_trusted_proxies_are_refused_by_name(text: str) -> None:
    with pytest.raises(ValueError, match=f"trusted proxy '{text}'"):
        parse_trusted_proxies(f"127.0.0.1, {text}")


# ---- one Argon2 verification per attempt -------------------------------------------------------


class CountingVerifier:
    """The real Argon2 verifier, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, stored_hash: str, password: str) -> bool:
        self.calls += 1
        return passwords.argon2_verify(stored_hash, password)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[UnitOfWork, str]]:
    """A migrated SQLite store with the admin (password ``admin-password``), the
    local user ``acme/alice`` and ``acme/oidc-only`` who has no password."""
    engine = create_engine(f"sqlite+pysqlite:///{tmp_path / 'mgmt-api.db'}")
    migrate(engine)
    uow = UnitOfWork(engine)
    secret = bootstrap(uow, "admin-password")
    with write_tx(engine) as conn:
        for fqn, kind in (
            ("organizations/acme", "Organization"),
            ("organizations/acme/users/alice", "User"),
            ("organizations/acme/users/oidc-only", "User"),
        ):
            parent, _, name = fqn.rpartition("/")
            repo.insert(
                conn,
                repo.Resource(
                    fqn=fqn, parent=parent.rpartition("/")[0], kind=kind, name=name, spec={},
                    status={}, etag='"e"', protected=False, creator="test", create_time=0,
                    update_time=0,
                ),
            )  # fmt: skip
        repo.set_password_hash(
            conn, "organizations/acme/users/alice", passwords.hash_password("alice-password")
        )
    try:
        yield uow, secret
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("login", "password"),
    [
        ("acme/alice", "wrong-password"),  # an existing user, wrong password
        ("acme/nobody", "wrong-password"),  # no such user
        ("ghost-org/nobody", "wrong-password"),  # no such organization
        ("acme/oidc-only", "wrong-password"),  # a user without a password
        ("acme/Not A Name!", "wrong-password"),  # not even a valid name
        ("admin", "wrong-password"),
    ],
)
def test_every_failed_login_costs_one_verification(
    store: tuple[UnitOfWork, str], login: str, password: str
) -> None:
    """Unknown names cost what known ones do: the answer time tells nothing."""
    uow, secret = store
    verifier = CountingVerifier()
    authn = Authenticator(uow, secret, passwords=passwords.VerifiedCache(verify_hash=verifier))
    with pytest.raises(ApiError) as raised:
        authn.basic(login, password, "10.0.0.1")
    assert raised.value.code is Code.UNAUTHENTICATED
    assert verifier.calls == 1


def test_a_correct_password_costs_one_verification_then_none(
    store: tuple[UnitOfWork, str],
) -> None:
    uow, secret = store
    verifier = CountingVerifier()
    authn = Authenticator(uow, secret, passwords=passwords.VerifiedCache(verify_hash=verifier))
    for _ in range(3):
        assert authn.basic("acme/alice", "alice-password", "10.0.0.1").fqn.endswith("/alice")
    assert verifier.calls == 1  # then cached, for this stored hash
