"""Wiring: everything the REST layer needs, built once from the install config.

The app creates one ``IdentityService`` at start-up (with one shared
``httpx.AsyncClient`` and the login-state store) and calls:

* ``login(name)`` → ``OidcLogin`` for ``/v2/oidc[/{name}]/login`` and
  ``/callback`` (``None`` for an unknown name: answer 404);
* ``exchanger(name)`` → ``TokenExchanger`` for the token-exchange login;
* ``configuration()`` → the body of ``/v2/oidc/configuration``;
* ``directory_sync(org, store)`` → ``DirectorySync`` for the periodic job
  and ``POST /v2/organizations/{org}:sync`` (``None`` when sync is off).
"""

from __future__ import annotations

from typing import Any

import httpx

from mgmt_api.identity.config import IdentityProviderConfig
from mgmt_api.identity.discovery import DiscoveryCache, ProviderMetadata
from mgmt_api.identity.errors import ProviderError
from mgmt_api.identity.jwks import ProviderKeys
from mgmt_api.identity.login_state import LoginStateStore
from mgmt_api.identity.oidc import OidcLogin
from mgmt_api.identity.public_config import OidcConfiguration, configuration_response
from mgmt_api.identity.sync.graph import GraphSource
from mgmt_api.identity.sync.ldap import LdapSource
from mgmt_api.identity.sync.runner import DirectorySource, DirectorySync
from mgmt_api.identity.sync.store import DirectoryStore
from mgmt_api.identity.token_exchange import TokenExchanger


class IdentityService:
    def __init__(
        self,
        config: IdentityProviderConfig,
        *,
        http: httpx.AsyncClient,
        states: LoginStateStore,
        allowed_return_origins: tuple[str, ...] = (),
    ) -> None:
        self.config = config
        self._http = http
        self.discovery = DiscoveryCache(http)
        # One JWKS cache per configuration, shared by its logins and its token exchange.
        keys = {c.name: ProviderKeys(http) for c in config.oidc}
        self._logins = {
            c.name: OidcLogin(
                c,
                http=http,
                discovery=self.discovery,
                states=states,
                allowed_return_origins=allowed_return_origins,
                keys=keys[c.name],
            )
            for c in config.oidc
        }
        self._exchangers: dict[str, TokenExchanger[Any]] = {
            c.name: TokenExchanger(c, http=http, discovery=self.discovery, keys=keys[c.name])
            for c in config.oidc
        }

    def login(self, name: str | None = None) -> OidcLogin | None:
        oidc = self.config.oidc_named(name)
        return self._logins[oidc.name] if oidc is not None else None

    def exchanger(self, name: str | None = None) -> TokenExchanger[Any] | None:
        oidc = self.config.oidc_named(name)
        return self._exchangers[oidc.name] if oidc is not None else None

    async def configuration(self) -> OidcConfiguration:
        metadata: dict[str, ProviderMetadata | None] = {}
        for oidc in self.config.oidc:
            try:
                metadata[oidc.name] = await self.discovery.get(oidc.configuration_uri)
            except ProviderError:
                metadata[oidc.name] = None
        return configuration_response(self.config, metadata)

    def directory_sync(self, org: str, store: DirectoryStore) -> DirectorySync | None:
        sync = self.config.sync
        if sync is None:
            return None
        source: DirectorySource
        if sync.azure is not None:
            source = GraphSource(sync.azure, self._http)
        else:
            assert sync.ldap is not None
            source = LdapSource(sync.ldap)
        return DirectorySync(
            org,
            source,
            store,
            interval_s=sync.interval_s,
            max_delete_percent=sync.max_delete_percent,
        )
