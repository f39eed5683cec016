"""The wiring the REST layer calls, against the real test OIDC provider."""

from __future__ import annotations

import dataclasses
from typing import TypeGuard

import httpx

from mgmt_api.identity.config import IdentityProviderConfig, OidcConfig
from mgmt_api.identity.login_state import InMemoryLoginStateStore
from mgmt_api.identity.public_config import (
    OidcConfiguration,
    OidcEnabled,
    configuration_response,
)
from mgmt_api.identity.secrets import SecretRef
from mgmt_api.identity.service import IdentityService
from mgmt_api.identity.sync.store import InMemoryDirectoryStore
from tests.support.oidc_provider.launcher import (
    DEVICE_CLIENT_ID,
    EXCHANGE_CLIENT_ID,
    WEB_CLIENT_ID,
    RunningProvider,
)


def enabled(body: OidcConfiguration) -> TypeGuard[OidcEnabled]:
    """The body says login is on, so it has the default configuration's fields."""
    return body["enabled"] is True


async def test_public_configuration_describes_every_login_mode(
    idp_config: IdentityProviderConfig, oidc_provider: RunningProvider, http: httpx.AsyncClient
) -> None:
    service = IdentityService(idp_config, http=http, states=InMemoryLoginStateStore())
    body = await service.configuration()
    assert enabled(body)
    assert body["issuer"] == oidc_provider.issuer
    assert body["clientId"] == WEB_CLIENT_ID
    assert body["deviceCodeSupported"] and body["deviceCodeClientId"] == DEVICE_CLIENT_ID
    assert body["tokenExchangeSupported"] and body["tokenExchangeClientId"] == EXCHANGE_CLIENT_ID
    assert body["deviceAuthorizationEndpoint"] == f"{oidc_provider.issuer}/device/auth"
    assert body["loginUrl"] == "/v2/oidc/login"
    assert [c["loginUrl"] for c in body["configurations"]] == ["/v2/oidc/login"]
    assert "secret" not in str(body).lower()
    assert service.login("corp") is service.login(None)
    assert service.login("unknown") is None and service.exchanger("unknown") is None
    # One JWKS cache per configuration: login and token exchange share fetches and the
    # refetch budget for unknown key ids.
    login, exchanger = service.login("corp"), service.exchanger("corp")
    assert login is not None and exchanger is not None and login.keys is exchanger.keys
    assert service.directory_sync("acme", InMemoryDirectoryStore()) is None


def test_configuration_without_oidc_or_discovery() -> None:
    assert configuration_response(IdentityProviderConfig(), {}) == {
        "enabled": False,
        "configurations": [],
    }
    oidc = OidcConfig(
        name="a",
        client_id="c",
        client_secret=SecretRef("env", "X"),
        configuration_uri="https://idp.invalid/.well-known/openid-configuration",
        redirect_uri="https://mp/cb",
        scopes=("email",),
    )
    second = dataclasses.replace(oidc, name="b", device_code_client_id="cli")
    body = configuration_response(IdentityProviderConfig(oidc=(oidc, second)), {"a": None})
    assert enabled(body) and "issuer" not in body
    assert body["deviceCodeSupported"] is False and body["tokenExchangeSupported"] is False
    named = body["configurations"][1]
    assert named["loginUrl"] == "/v2/oidc/b/login" and named["callbackUrl"] == "/v2/oidc/b/callback"
    assert named["deviceCodeSupported"] is True
