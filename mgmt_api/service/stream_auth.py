"""Who may open a cluster's streams: its agent service account's keys, for its cluster only.

A subscriber (a cluster's ratelimit or extauthz instance; its gateways and
agent use the same credentials) presents a JWT signed with a key of the
cluster's agent account (``.../clusters/{cluster}/serviceaccounts/agent``),
carrying the stream audience (``meshplane.distribution_contract.TOKEN_AUDIENCE``):
a stream token is useless on REST and a REST token opens no stream. It is
verified as REST verifies tokens, and its key must belong to the cluster the
subscriber names, so no credential ever reads another cluster's policies.

A token is checked once, when a stream opens, and streams live for hours.
:meth:`StreamAuth.still_admitted` is asked whenever a stream wakes (every
store change, and at least every heartbeat): deleting the key, the agent
account or the cluster ends the open streams within seconds, instead of
letting them receive policies (with inline secrets) until a reconnect.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from meshplane.gateway_contract import GATEWAY_TOKEN_TTL_SECONDS
from mgmt_api import fqn as fqnmod
from mgmt_api.auth import tokens
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

    def authenticate(
        self,
        token: str,
        organization: str,
        cluster: str,
        audience: str = tokens.DISTRIBUTION_AUDIENCE,
    ) -> str:
        """Admit ``token`` for the cluster and the stream's ``audience`` (the policy
        stream's by default; the agent tunnel and the gateways' ADS have their own);
        return its key id.

        A token may live as long as the cluster's ``tokenTtl``, except a gateway's,
        which may live :data:`~meshplane.gateway_contract.GATEWAY_TOKEN_TTL_SECONDS`
        (Envoy presents the token of its bootstrap on every reconnect).
        """
        expected = fqnmod.agent_fqn(fqnmod.cluster_fqn(organization, cluster))
        try:
            kid = tokens.header_kid(token)
            with self._uow.read() as conn:
                key = repo.get_key(conn, kid)
                if key is None:
                    raise AuthError("unknown or revoked key")
                owner, jwk = key
                if owner != expected:
                    raise AuthError(f"the credentials belong to {owner}, not to {expected}")
                max_ttl = service_account_ttl(conn, owner)
                if audience == tokens.GATEWAY_AUDIENCE:
                    max_ttl = max(max_ttl, GATEWAY_TOKEN_TTL_SECONDS)
                tokens.verify_service_account(jwk, token, self._clock(), max_ttl, audience=audience)
        except tokens.TokenError as exc:
            raise AuthError(str(exc)) from None
        return kid

    async def authenticate_async(
        self,
        token: str,
        organization: str,
        cluster: str,
        audience: str = tokens.DISTRIBUTION_AUDIENCE,
    ) -> str:
        return await asyncio.to_thread(self.authenticate, token, organization, cluster, audience)

    def still_admitted(self, key_id: str, organization: str, cluster: str) -> Revocation | None:
        """Why an open stream must end, or None while its key and cluster exist."""
        cluster_fqn = fqnmod.cluster_fqn(organization, cluster)
        with self._uow.read() as conn:
            if not repo.exists(conn, cluster_fqn):
                return Revocation("the cluster was deleted", cluster_gone=True)
            key = repo.get_key(conn, key_id)
            if key is None or key[0] != fqnmod.agent_fqn(cluster_fqn):
                return Revocation("the stream's key was revoked")
        return None

    async def still_admitted_async(
        self, key_id: str, organization: str, cluster: str
    ) -> Revocation | None:
        return await asyncio.to_thread(self.still_admitted, key_id, organization, cluster)
