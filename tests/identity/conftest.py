"""Fixtures of the identity tests: the real test OIDC provider, slapd, a migrated SQLite store."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import Engine

from mgmt_api.identity.config import IdentityProviderConfig, load_identity_provider
from mgmt_api.store.engine import create_engine, migrate
from tests.identity.install_config import oidc_section, write_install_config
from tests.support.oidc_provider.launcher import RunningProvider, start_provider
from tests.support.slapd import Slapd, start_slapd

CALLBACK = "https://mp.example.test:8443/iam/v2/oidc/callback"


@pytest.fixture(scope="session")
def oidc_provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProvider]:
    log = tmp_path_factory.mktemp("oidc") / "provider.log"
    provider = start_provider([CALLBACK], log)
    try:
        yield provider
    finally:
        provider.stop()


@pytest.fixture(scope="session")
def slapd() -> Iterator[Slapd]:
    server = start_slapd()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10.0) as client:
        yield client


@pytest.fixture
def idp_config(tmp_path: Path, oidc_provider: RunningProvider) -> IdentityProviderConfig:
    config = write_install_config(tmp_path, oidc_section(tmp_path, oidc_provider, CALLBACK))
    return load_identity_provider(config, environ={})


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[Engine]:
    """The management plane's real schema (all migrations) in a throwaway SQLite file."""
    engine = create_engine(f"sqlite+pysqlite:///{tmp_path / 'mgmt-api.db'}")
    migrate(engine)
    try:
        yield engine
    finally:
        engine.dispose()
