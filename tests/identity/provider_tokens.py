"""Access tokens from the test OIDC provider, as a service principal gets them."""

from __future__ import annotations

import httpx

from tests.support.oidc_provider.launcher import RunningProvider


def client_credentials_token(
    provider: RunningProvider, client_id: str, secret: str, resource: str
) -> str:
    """A signed JWT access token (client credentials) for ``resource``: ``API_V2`` gives
    Entra-v2-shaped tokens, ``API_V1`` version-1 ones (see provider.mjs)."""
    discovery = httpx.get(provider.configuration_uri, timeout=10).json()
    response = httpx.post(
        discovery["token_endpoint"],
        data={
            "grant_type": "client_credentials",
            "client_id": client_id,
            "client_secret": secret,
            "resource": resource,
            "scope": "api",
        },
        timeout=10,
    )
    assert response.status_code == 200, response.text
    return str(response.json()["access_token"])
