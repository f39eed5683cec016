"""Fixtures: one mgmt-api subprocess per store (SQLite, PostgreSQL) per session.

Every test runs against both stores through the ``server`` fixture; tests
isolate themselves by creating uniquely named organizations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.mgmt_api.harness import MgmtServer, ok, unique
from tests.support.postgres import PostgresServer, find_bin_dir

BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    bin_dir = find_bin_dir()
    if bin_dir is None:
        pytest.skip("no PostgreSQL binaries (initdb/postgres) on this machine")
    server = PostgresServer(bin_dir).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def database_factory(request: pytest.FixtureRequest) -> Callable[[str], str | None]:
    """backend name -> a fresh database URL (None = SQLite in the server's data dir)."""

    def make(backend: str) -> str | None:
        if backend == "sqlite":
            return None
        pg: PostgresServer = request.getfixturevalue("postgres")
        return pg.new_database()

    return make


@pytest.fixture(scope="session", params=BACKENDS)
def server(
    request: pytest.FixtureRequest, database_factory: Callable[[str], str | None]
) -> Iterator[MgmtServer]:
    srv = MgmtServer(database_factory(request.param)).start()
    srv.backend = request.param  # type: ignore[attr-defined]
    yield srv
    srv.close()


@pytest.fixture
def admin(server: MgmtServer) -> Iterator[httpx.Client]:
    with server.admin() as client:
        yield client


@pytest.fixture
def org(admin: httpx.Client) -> str:
    name = unique("org")
    ok(admin.post("/v2/organizations", json={"name": name, "organization": {"displayName": name}}))
    return name


@pytest.fixture
def make_user(admin: httpx.Client, server: MgmtServer) -> Callable[..., httpx.Client]:
    """Create a local user in an org with a password; returns a client logged in as it."""

    def make(org: str, name: str | None = None) -> httpx.Client:
        name = name or unique("u")
        ok(
            admin.post(
                f"/v2/organizations/{org}/users",
                json={"name": name, "user": {"loginName": name, "password": "user-password-1"}},
            )
        )
        return server.client(auth=(f"{org}/{name}", "user-password-1"))

    return make
