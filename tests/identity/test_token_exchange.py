"""Token-exchange login rules (spec 5) with real signed tokens from the test OIDC provider."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json

import httpx
import pytest

from mgmt_api.identity.config import IdentityProviderConfig
from mgmt_api.identity.discovery import DiscoveryCache
from mgmt_api.identity.errors import TokenExchangeRefusedError
from mgmt_api.identity.token_exchange import (
    ACCESS_TOKEN_TYPE,
    TOKEN_EXCHANGE_GRANT,
    ExchangeSubject,
    IssuedToken,
    TokenExchanger,
    TokenExchangeRequestError,
)
from tests.identity.provider_tokens import client_credentials_token
from tests.support.oidc_provider.launcher import (
    API_V1,
    API_V2,
    EXCHANGE_CLIENT_ID,
    EXCHANGE_CLIENT_SECRET,
    OTHER_CLIENT_ID,
    OTHER_CLIENT_SECRET,
    WEB_CLIENT_ID,
    RunningProvider,
)


async def provider_access_token(
    http: httpx.AsyncClient, provider: RunningProvider, client_id: str, secret: str, resource: str
) -> str:
    """A service-principal access token (client credentials) from the provider."""
    del http  # the helper has its own client; kept so the call sites read the same
    return await asyncio.to_thread(client_credentials_token, provider, client_id, secret, resource)


def claims_of(token: str) -> dict[str, object]:
    payload = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


class Platform:
    """The management plane's side: a user table and a token service."""

    def __init__(self, user_ids: set[str]) -> None:
        self.user_ids = user_ids
        self.minted: list[str] = []
        self.subjects: list[ExchangeSubject] = []

    async def find_user(self, user_id: str) -> str | None:
        return user_id if user_id in self.user_ids else None

    async def mint(self, user: str, subject: ExchangeSubject) -> IssuedToken:
        self.minted.append(user)
        self.subjects.append(subject)
        return IssuedToken(access_token=f"platform-token-for-{user}", expires_in=900)


def exchanger(config: IdentityProviderConfig, http: httpx.AsyncClient) -> TokenExchanger[str]:
    oidc = config.oidc_named(None)
    assert oidc is not None
    return TokenExchanger(oidc, http=http, discovery=DiscoveryCache(http))


def form(token: str) -> dict[str, str]:
    return {
        "grant_type": TOKEN_EXCHANGE_GRANT,
        "subject_token": token,
        "subject_token_type": ACCESS_TOKEN_TYPE,
    }


async def test_exchange_allowed_for_the_configured_client_with_a_user_record(
    idp_config: IdentityProviderConfig, oidc_provider: RunningProvider, http: httpx.AsyncClient
) -> None:
    token = await provider_access_token(
        http, oidc_provider, EXCHANGE_CLIENT_ID, EXCHANGE_CLIENT_SECRET, API_V2
    )
    claims = claims_of(token)
    assert claims["ver"] == "2.0" and claims["azp"] == EXCHANGE_CLIENT_ID
    assert claims["sub"] == EXCHANGE_CLIENT_ID  # a service principal's subject is its client id
    platform = Platform({EXCHANGE_CLIENT_ID})
    body = await exchanger(idp_config, http).exchange(
        form(token), find_user=platform.find_user, mint=platform.mint
    )
    assert body == {
        "access_token": f"platform-token-for-{EXCHANGE_CLIENT_ID}",
        "issued_token_type": ACCESS_TOKEN_TYPE,
        "token_type": "Bearer",
        "expires_in": 900,
    }
    assert platform.minted == [EXCHANGE_CLIENT_ID]
    # The platform token service learns when the provider token ends, to cap its own.
    assert platform.subjects[0].expires_at == claims["exp"]


async def test_exchange_refuses_a_token_issued_for_another_audience(
    idp_config: IdentityProviderConfig, oidc_provider: RunningProvider, http: httpx.AsyncClient
) -> None:
    """The provider's token is for ``urn:meshplane:api``; a management plane whose
    ``tokenExchange.audience`` is the default (``api://<clientId>`` or ``<clientId>``)
    must refuse it: it was meant for another API."""
    token = await provider_access_token(
        http, oidc_provider, EXCHANGE_CLIENT_ID, EXCHANGE_CLIENT_SECRET, API_V2
    )
    assert claims_of(token)["aud"] == API_V2
    configured = idp_config.oidc_named(None)
    assert configured is not None and configured.token_exchange_audiences == {API_V2}
    default = dataclasses.replace(configured, token_exchange_audience=())
    assert default.token_exchange_audiences == {f"api://{WEB_CLIENT_ID}", WEB_CLIENT_ID}
    platform = Platform({EXCHANGE_CLIENT_ID})
    refusing: TokenExchanger[str] = TokenExchanger(
        default, http=http, discovery=DiscoveryCache(http)
    )
    with pytest.raises(TokenExchangeRefusedError) as refused:
        await refusing.exchange(form(token), find_user=platform.find_user, mint=platform.mint)
    assert refused.value.reason == "wrong_audience"
    assert platform.minted == []


async def test_exchange_refused_for_another_client(
    idp_config: IdentityProviderConfig, oidc_provider: RunningProvider, http: httpx.AsyncClient
) -> None:
    token = await provider_access_token(
        http, oidc_provider, OTHER_CLIENT_ID, OTHER_CLIENT_SECRET, API_V2
    )
    platform = Platform({OTHER_CLIENT_ID, EXCHANGE_CLIENT_ID})
    with pytest.raises(TokenExchangeRefusedError) as refused:
        await exchanger(idp_config, http).exchange(
            form(token), find_user=platform.find_user, mint=platform.mint
        )
    assert refused.value.reason == "client_not_allowed"
    assert platform.minted == []


async def test_exchange_refused_without_a_user_record(
    idp_config: IdentityProviderConfig, oidc_provider: RunningProvider, http: httpx.AsyncClient
) -> None:
    token = await provider_access_token(
        http, oidc_provider, EXCHANGE_CLIENT_ID, EXCHANGE_CLIENT_SECRET, API_V2
    )
    platform = Platform({"someone-else"})
    with pytest.raises(TokenExchangeRefusedError) as refused:
        await exchanger(idp_config, http).exchange(
            form(token), find_user=platform.find_user, mint=platform.mint
        )
    assert refused.value.reason == "unknown_user"
    assert EXCHANGE_CLIENT_ID in refused.value.message
    assert platform.minted == []


async def test_exchange_refuses_a_version_1_token_and_says_how_to_fix_it(
    idp_config: IdentityProviderConfig, oidc_provider: RunningProvider, http: httpx.AsyncClient
) -> None:
    token = await provider_access_token(
        http, oidc_provider, EXCHANGE_CLIENT_ID, EXCHANGE_CLIENT_SECRET, API_V1
    )
    assert claims_of(token)["ver"] == "1.0" and "azp" not in claims_of(token)
    platform = Platform({EXCHANGE_CLIENT_ID})
    with pytest.raises(TokenExchangeRefusedError) as refused:
        await exchanger(idp_config, http).exchange(
            form(token), find_user=platform.find_user, mint=platform.mint
        )
    assert refused.value.reason == "token_version_1"
    assert "accessTokenAcceptedVersion" in refused.value.message
    assert platform.minted == []


async def test_exchange_refuses_a_token_with_a_forged_signature(
    idp_config: IdentityProviderConfig, oidc_provider: RunningProvider, http: httpx.AsyncClient
) -> None:
    token = await provider_access_token(
        http, oidc_provider, OTHER_CLIENT_ID, OTHER_CLIENT_SECRET, API_V2
    )
    header, _payload, signature = token.split(".")
    claims = claims_of(token)
    claims["azp"] = EXCHANGE_CLIENT_ID  # pretend to be the allowed client
    forged_payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    platform = Platform({OTHER_CLIENT_ID, EXCHANGE_CLIENT_ID})
    with pytest.raises(TokenExchangeRefusedError) as refused:
        await exchanger(idp_config, http).exchange(
            form(f"{header}.{forged_payload}.{signature}"),
            find_user=platform.find_user,
            mint=platform.mint,
        )
    assert refused.value.reason == "bad_signature"


async def test_a_malformed_exchange_request_is_an_oauth_error(
    idp_config: IdentityProviderConfig, http: httpx.AsyncClient
) -> None:
    platform = Platform(set())
    with pytest.raises(TokenExchangeRequestError) as bad:
        await exchanger(idp_config, http).exchange(
            {
                "grant_type": TOKEN_EXCHANGE_GRANT,
                "subject_token": "x",
                "subject_token_type": "urn:x",
            },
            find_user=platform.find_user,
            mint=platform.mint,
        )
    assert bad.value.error == "invalid_request"
