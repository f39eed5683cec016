"""RFC 8628 device-code login against the real test OIDC provider.

The client side is meshctl's (``meshctl.oauth`` on ``meshplane.oauth_device``):
the one implementation of the polling loop, exercised here against the
real provider and the server's ``verify_device_login``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import httpx
import pytest

from meshctl.oauth import DeviceLoginError, poll_for_tokens, start_device_authorization
from meshctl.transport import Transport
from mgmt_api.identity.config import IdentityProviderConfig
from mgmt_api.identity.discovery import DiscoveryCache
from mgmt_api.identity.login_state import InMemoryLoginStateStore
from mgmt_api.identity.oidc import OidcLogin
from tests.identity.browser import approve_device
from tests.support.oidc_provider.launcher import DEVICE_SHORT_CLIENT_ID, RunningProvider

DEVICE_SCOPES = ["openid", "email", "profile"]


def quick_sleep(seconds: float) -> None:
    """The provider does not enforce the 5 s default interval; poll faster so the test is short."""
    time.sleep(min(seconds, 0.2))


def client() -> Transport:
    return Transport(timeout=10.0)


async def endpoints(http: httpx.AsyncClient, provider: RunningProvider) -> tuple[str, str]:
    metadata = await DiscoveryCache(http).get(provider.configuration_uri)
    assert metadata.device_authorization_endpoint is not None
    return metadata.device_authorization_endpoint, metadata.token_endpoint


async def test_device_login_end_to_end_yields_an_id_token_the_server_accepts(
    idp_config: IdentityProviderConfig, oidc_provider: RunningProvider, http: httpx.AsyncClient
) -> None:
    oidc = idp_config.oidc_named(None)
    assert oidc is not None and oidc.device_code_client_id is not None
    device_endpoint, token_endpoint = await endpoints(http, oidc_provider)
    authorization = start_device_authorization(
        client(), device_endpoint, oidc.device_code_client_id, DEVICE_SCOPES
    )
    assert authorization.user_code and authorization.verification_uri.startswith(
        oidc_provider.issuer
    )
    assert authorization.verification_uri_complete is not None
    assert authorization.device_code not in repr(authorization)

    async def user_in_browser() -> str:
        await asyncio.sleep(0.3)  # the CLI is already polling: authorization_pending first
        async with httpx.AsyncClient(timeout=10.0) as browser:
            return await approve_device(browser, authorization.verification_uri_complete or "")

    async with asyncio.timeout(30):
        page, tokens = await asyncio.gather(
            user_in_browser(),
            asyncio.to_thread(
                poll_for_tokens,
                client(),
                token_endpoint,
                oidc.device_code_client_id,
                authorization,
                sleep=quick_sleep,
            ),
        )
    assert "device login complete" in page
    assert tokens.id_token is not None and tokens.access_token

    # The management plane side: the ID token is for the device client, without nonce.
    login = OidcLogin(
        oidc, http=http, discovery=DiscoveryCache(http), states=InMemoryLoginStateStore()
    )
    identity = await login.verify_device_login(tokens.id_token)
    assert identity.subject == "alice"
    assert identity.email == "alice@example.test"


async def test_device_login_denied_by_the_user(
    idp_config: IdentityProviderConfig, oidc_provider: RunningProvider, http: httpx.AsyncClient
) -> None:
    oidc = idp_config.oidc_named(None)
    assert oidc is not None and oidc.device_code_client_id is not None
    device_endpoint, token_endpoint = await endpoints(http, oidc_provider)
    authorization = start_device_authorization(
        client(), device_endpoint, oidc.device_code_client_id, DEVICE_SCOPES
    )
    async with httpx.AsyncClient(timeout=10.0) as browser:
        await approve_device(browser, authorization.verification_uri_complete or "", account="deny")
    with pytest.raises(DeviceLoginError) as failed:
        await asyncio.to_thread(
            poll_for_tokens,
            client(),
            token_endpoint,
            oidc.device_code_client_id,
            authorization,
            sleep=quick_sleep,
        )
    assert failed.value.error == "access_denied"


async def test_device_code_expires_when_nobody_approves(
    oidc_provider: RunningProvider, http: httpx.AsyncClient
) -> None:
    # This client's device codes live 2 seconds at the provider.
    device_endpoint, token_endpoint = await endpoints(http, oidc_provider)
    authorization = start_device_authorization(
        client(), device_endpoint, DEVICE_SHORT_CLIENT_ID, DEVICE_SCOPES
    )
    assert authorization.expires_in <= 2
    with pytest.raises(DeviceLoginError) as failed:
        await asyncio.to_thread(
            poll_for_tokens,
            client(),
            token_endpoint,
            DEVICE_SHORT_CLIENT_ID,
            authorization,
            sleep=quick_sleep,
        )
    assert failed.value.error == "expired_token"


async def test_the_provider_refuses_an_unknown_device_client(
    oidc_provider: RunningProvider, http: httpx.AsyncClient
) -> None:
    device_endpoint, _ = await endpoints(http, oidc_provider)
    with pytest.raises(DeviceLoginError) as failed:
        start_device_authorization(client(), device_endpoint, "no-such-client", DEVICE_SCOPES)
    assert failed.value.error == "invalid_client"


def test_the_shared_device_rules_import_only_the_standard_library() -> None:
    """meshctl uses ``meshplane.oauth_device``: it must not pull in httpx, FastAPI,
    SQLAlchemy or any server module."""
    code = (
        "import json, sys; before = set(sys.modules); import meshplane.oauth_device; "
        "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
        "print(json.dumps(sorted(new - set(sys.stdlib_module_names) - {'meshplane'})))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert json.loads(out.stdout) == []
