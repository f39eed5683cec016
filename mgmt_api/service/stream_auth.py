"""Who may open a cluster's streams: a key of the one cluster account the channel admits.

Each stream (policy stream as extauthz or ratelimit, gateway ADS, agent
tunnel) is opened with a JWT signed with a key of one of the cluster's
accounts (``.../clusters/{cluster}/serviceaccounts/{agent,gateway,extauthz,ratelimit}``),
carrying the stream's audience: a stream token is useless on REST and a
REST token opens no stream. It is verified as REST verifies tokens, its
key must belong to the cluster the subscriber names, and that account's row
of :data:`mgmt_api.domain.cluster_accounts.ACCOUNTS` must admit the channel
(audience and node kind), so no credential reads another cluster's config,
nor another component's of its own cluster.

A token is checked once, when a stream opens, and streams live for hours.
:meth:`StreamAuth.still_admitted` is asked whenever a stream wakes (every
store change, and at least every heartbeat): deleting the key, its account
or the cluster ends the open streams within seconds, instead of letting
them receive policies (with inline secrets) until a reconnect.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from meshplane.gateway_contract import GATEWAY_TOKEN_TTL_SECONDS
from mgmt_api import fqn as fqnmod
from mgmt_api.auth import tokens
from mgmt_api.domain import cluster_accounts as accounts
from mgmt_api.domain.cluster_accounts import Channel
from mgmt_api.service.authn import service_account_ttl
from mgmt_api.store import repo
from mgmt_api.store.uow import UnitOfWork


class AuthError(Exception):
    """Credentials missing, invalid, or not allowed for the requested cluster."""


@dataclass(frozen=True)
class Revocation:
    """Why an open stream may no longer receive its cluster's policies."""

    reason: str
    cluster_gone: bool = False


class StreamAuth:
    """Admits stream credentials for one cluster, and re-checks them while streams live."""

    def __init__(self, uow: UnitOfWork, clock: Callable[[], float] = time.time) -> None:
        self._uow = uow
        self._clock = clock

    def authenticate(self, token: str, organization: str, cluster: str, channel: Channel) -> str:
        """Admit ``token`` for ``channel`` of the cluster; return its key id.

        A token may live as long as the cluster's ``tokenTtl``, except a gateway's,
        which may live :data:`~meshplane.gateway_contract.GATEWAY_TOKEN_TTL_SECONDS`
        (Envoy presents the token of its bootstrap on every reconnect).
        """
        cluster_fqn = fqnmod.cluster_fqn(organization, cluster)
        try:
            kid = tokens.header_kid(token)
            with self._uow.read() as conn:
                key = repo.get_key(conn, kid)
                if key is None:
                    raise AuthError("unknown or revoked key")
                owner, jwk = key
                refused = accounts.refusal(owner, cluster_fqn, channel)
                if refused is not None:
                    raise AuthError(refused)
                max_ttl = service_account_ttl(conn, owner)
                if channel.audience == tokens.GATEWAY_AUDIENCE:
                    max_ttl = max(max_ttl, GATEWAY_TOKEN_TTL_SECONDS)
                tokens.verify_service_account(
                    jwk, token, self._clock(), max_ttl, audience=channel.audience
                )
        except tokens.TokenError as exc:
            raise AuthError(str(exc)) from None
        return kid

    async def authenticate_async(
        self, token: str, organization: str, cluster: str, channel: Channel
    ) -> str:
        return await asyncio.to_thread(self.authenticate, token, organization, cluster, channel)

    def still_admitted(self, key_id: str, organization: str, cluster: str) -> Revocation | None:
        """Why an open stream must end, or None while its key and cluster exist."""
        cluster_fqn = fqnmod.cluster_fqn(organization, cluster)
        with self._uow.read() as conn:
            if not repo.exists(conn, cluster_fqn):
                return Revocation("the cluster was deleted", cluster_gone=True)
            key = repo.get_key(conn, key_id)
            found = accounts.account_of(key[0]) if key is not None else None
            if found is None or found[0] != cluster_fqn:
                return Revocation("the stream's key was revoked")
        return None

    async def still_admitted_async(
        self, key_id: str, organization: str, cluster: str
    ) -> Revocation | None:
        return await asyncio.to_thread(self.still_admitted, key_id, organization, cluster)
