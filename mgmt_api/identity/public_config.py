"""The body of the public ``GET /v2/oidc/configuration``.

It tells a client (``meshctl``, the UI) enough to start any of the logins:
the issuer, the client ids, the scopes, and whether device-code and token
exchange are on. It holds nothing secret, so it needs no authentication; the
issuer and device endpoint come from discovery when it is reachable, and
are left out (not failed) when it is not, so the endpoint stays up during a
provider outage.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NotRequired, TypedDict

from mgmt_api.identity.config import IdentityProviderConfig, OidcConfig
from mgmt_api.identity.discovery import ProviderMetadata


class OidcLogin(TypedDict):
    """One configuration's entry; the discovered endpoints only while discovery answers."""

    name: str
    clientId: str
    scopes: list[str]
    loginUrl: str
    callbackUrl: str
    deviceCodeSupported: bool
    tokenExchangeSupported: bool
    deviceCodeClientId: NotRequired[str]
    tokenExchangeClientId: NotRequired[str]
    issuer: NotRequired[str]
    tokenEndpoint: NotRequired[str]
    deviceAuthorizationEndpoint: NotRequired[str]


class OidcDisabled(TypedDict):
    enabled: bool  # False
    configurations: list[OidcLogin]  # empty


class OidcEnabled(OidcLogin):
    """The default (first) configuration's entry at the top level, and every entry."""

    enabled: bool  # True
    configurations: list[OidcLogin]


OidcConfiguration = OidcDisabled | OidcEnabled


def _one(config: OidcConfig, metadata: ProviderMetadata | None, *, default: bool) -> OidcLogin:
    prefix = "/v2/oidc" if default else f"/v2/oidc/{config.name}"
    body: OidcLogin = {
        "name": config.name,
        "clientId": config.client_id,
        "scopes": list(config.request_scopes),
        "loginUrl": f"{prefix}/login",
        "callbackUrl": f"{prefix}/callback",
        "deviceCodeSupported": config.device_code_client_id is not None,
        "tokenExchangeSupported": config.token_exchange_client_id is not None,
    }
    if config.device_code_client_id is not None:
        body["deviceCodeClientId"] = config.device_code_client_id
    if config.token_exchange_client_id is not None:
        body["tokenExchangeClientId"] = config.token_exchange_client_id
    if metadata is not None:
        body["issuer"] = metadata.issuer
        body["tokenEndpoint"] = metadata.token_endpoint
        if metadata.device_authorization_endpoint is not None:
            body["deviceAuthorizationEndpoint"] = metadata.device_authorization_endpoint
    return body


def configuration_response(
    config: IdentityProviderConfig, metadata: Mapping[str, ProviderMetadata | None]
) -> OidcConfiguration:
    """``metadata`` maps configuration names to their discovery (``None`` when unavailable).

    The top level describes the default (first) configuration, the shape the
    reference notes sketch; ``configurations`` lists all of them.
    """
    if not config.oidc:
        return {"enabled": False, "configurations": []}
    entries = [_one(c, metadata.get(c.name), default=(i == 0)) for i, c in enumerate(config.oidc)]
    return {"enabled": True, **entries[0], "configurations": entries}
