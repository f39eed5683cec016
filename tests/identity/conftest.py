"""Fixtures of the identity tests: the real test OIDC provider, slapd, the Graph stand-in."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from mgmt_api.identity.config import IdentityProviderConfig, load_identity_provider
from tests.support.oidc_provider.launcher import (
    DEVICE_CLIENT_ID,
    EXCHANGE_CLIENT_ID,
    WEB_CLIENT_ID,
    WEB_CLIENT_SECRET,
    RunningProvider,
    start_provider,
)
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


def write_install_config(tmp_path: Path, provider: RunningProvider) -> Path:
    secret = tmp_path / "client-secret"
    secret.write_text(WEB_CLIENT_SECRET + "\n")
    config = tmp_path / "install.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            spec:
              identityProvider:
                oidc:
                  - name: corp
                    clientId: {WEB_CLIENT_ID}
                    clientSecret: {{file: {secret}}}
                    providerConfig:
                      dynamic:
                        configurationUri: {provider.configuration_uri}
                    redirectUri: {CALLBACK}
                    scopes: [email, profile, offline_access]
                    offlineAccessConfig:
                      deviceCodeAuth: {{clientId: {DEVICE_CLIENT_ID}}}
                      tokenExchange: {{clientId: {EXCHANGE_CLIENT_ID}}}
            """
        )
    )
    return config


@pytest.fixture
def idp_config(tmp_path: Path, oidc_provider: RunningProvider) -> IdentityProviderConfig:
    return load_identity_provider(write_install_config(tmp_path, oidc_provider), environ={})
