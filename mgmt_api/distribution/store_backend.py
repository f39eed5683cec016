"""Store-backed ``build`` and ``authenticate`` for the distribution servicer.

``build(node)`` compiles what one service instance must enforce, and only for
its own cluster:

- ratelimit: every BackendTrafficPolicy under
  ``organizations/{org}/clusters/{cluster}``, compiled to envoyproxy/ratelimit
  YAML (one file per policy, see :mod:`mgmt_api.compiler.ratelimit`), plus
  the cluster's ``rateLimit`` switches as ``cluster-switches.json`` when it
  sets any (applied by :mod:`ratelimit.store.switches`);
- extauthz: one ``extauthz.yaml`` with ``defaultPolicy: deny`` and the
  ExtAuthzPolicies of every security group of the organization whose
  namespace selector (or, if it has none, its workspace's) reaches the
  cluster, named by :func:`mgmt_api.compiler.extauthz.policy_name`.

``authenticate(token, node)`` accepts only a JWT signed with a key of the
cluster's agent service account (``.../clusters/{cluster}/serviceaccounts/agent``),
verified as the REST API verifies it but with the distribution audience (so
a stream token is useless on REST and a REST token opens no stream), so a
subscriber can never ask for another cluster's snapshot. The token is checked
when the stream opens; ``still_admitted`` is checked whenever the stream wakes
(every store change, and at least every heartbeat), so revoking the key or
deleting the cluster ends the open streams within seconds.

Both run the blocking store reads in a worker thread so the event loop that
also serves REST keeps answering.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Connection, Engine

from meshplane.distribution_client import NodeIdentity
from mgmt_api.auth import tokens
from mgmt_api.compiler import extauthz as extauthz_compiler
from mgmt_api.compiler.ratelimit import render_rls_files
from mgmt_api.compiler.traffic_policy import BackendTrafficPolicy
from mgmt_api.distribution.selection import children, cluster_fqn, groups_reaching
from mgmt_api.distribution.server import AuthError, Compiled, Revocation
from mgmt_api.service.authn import service_account_ttl
from mgmt_api.service.resources import CLUSTER_AGENT_SA
from mgmt_api.service.validation import redis_url
from mgmt_api.store import repo
from mgmt_api.store.engine import read_tx
from ratelimit.store.switches import SWITCHES_FILE


def traffic_policies(
    conn: Connection, organization: str, cluster: str
) -> list[BackendTrafficPolicy]:
    """The cluster's stored BackendTrafficPolicies, parsed by the compiler's model."""
    policies = []
    for res in children(conn, cluster_fqn(organization, cluster), "BackendTrafficPolicy"):
        doc = {k: res.spec[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in res.spec}
        policies.append(BackendTrafficPolicy.model_validate(doc))
    return policies


def extauthz_policies(
    conn: Connection, organization: str, cluster: str
) -> list[tuple[str, dict[str, Any]]]:
    """(ext_authz name, stored spec) of the policies of groups that reach ``cluster``."""
    out: list[tuple[str, dict[str, Any]]] = []
    for reach in groups_reaching(conn, organization, cluster):
        for policy in children(conn, reach.group.fqn, "ExtAuthzPolicy"):
            name = extauthz_compiler.policy_name(reach.group.fqn, policy.name)
            out.append((name, policy.spec))
    return out


def cluster_switches(conn: Connection, organization: str, cluster: str) -> bytes | None:
    """The cluster's ``rateLimit`` switches for its ratelimit instances, if it sets any.

    Only references travel (``urlRef``); a ``url`` cannot carry a password
    (the API refuses it), so no secret is ever in a snapshot.
    """
    res = repo.get(conn, cluster_fqn(organization, cluster))
    rate_limit = res.spec.get("rateLimit") if res is not None else None
    if not rate_limit:
        return None
    url = ((rate_limit.get("backend") or {}).get("redis") or {}).get("url")
    if url is not None:
        # Stored as written (spec §2.9's ``host:port``); the service reads a URL.
        rate_limit = copy.deepcopy(rate_limit)
        rate_limit["backend"]["redis"]["url"] = redis_url(url)
    return json.dumps({"rateLimit": rate_limit}, sort_keys=True).encode()


class StoreBackend:
    """Builds snapshots from, and checks subscriber credentials against, the store."""

    def __init__(self, engine: Engine, clock: Callable[[], float] = time.time) -> None:
        self._engine = engine
        self._clock = clock

    def build_sync(self, node: NodeIdentity) -> Compiled:
        with read_tx(self._engine) as conn:
            if node.kind == "ratelimit":
                policies = traffic_policies(conn, node.organization, node.cluster)
                files = render_rls_files(node.cluster, policies)
                switches = cluster_switches(conn, node.organization, node.cluster)
                if switches is not None:
                    files[SWITCHES_FILE] = switches
                return Compiled(files)
            if node.kind == "extauthz":
                table = extauthz_policies(conn, node.organization, node.cluster)
                return Compiled({extauthz_compiler.FILE_NAME: extauthz_compiler.render_file(table)})
        raise ValueError(f"no snapshot for service kind {node.kind!r}")

    async def build(self, node: NodeIdentity) -> Compiled:
        return await asyncio.to_thread(self.build_sync, node)

    def authenticate_sync(
        self, token: str, node: NodeIdentity, audience: str = tokens.DISTRIBUTION_AUDIENCE
    ) -> str:
        """Admit ``token`` for ``node``'s cluster; return the key id it was signed with.

        The token must carry the distribution audience (a REST token is
        refused, and REST refuses this one: see :mod:`mgmt_api.auth.tokens`).
        """
        expected = agent_fqn(node.organization, node.cluster)
        try:
            kid = tokens.header_kid(token)
            with read_tx(self._engine) as conn:
                key = repo.get_key(conn, kid)
                if key is None:
                    raise AuthError("unknown or revoked key")
                owner, jwk = key
                if owner != expected:
                    raise AuthError(f"the credentials belong to {owner}, not to {expected}")
                tokens.verify_service_account(
                    jwk,
                    token,
                    self._clock(),
                    service_account_ttl(conn, owner),
                    audience=audience,
                )
        except tokens.TokenError as exc:
            raise AuthError(str(exc)) from None
        return kid

    async def authenticate(
        self, token: str, node: NodeIdentity, audience: str = tokens.DISTRIBUTION_AUDIENCE
    ) -> str:
        """The key id (the grant) of a token admitted for ``node``'s cluster and ``audience``
        (the agent tunnel passes its own)."""
        return await asyncio.to_thread(self.authenticate_sync, token, node, audience)

    def still_admitted_sync(self, grant: str, node: NodeIdentity) -> Revocation | None:
        """Why an open stream must end, or None while its key and cluster exist.

        A token is checked once, when the stream opens; streams live for
        hours. Deleting the key the stream was opened with, the cluster's
        agent account or the cluster itself must cut the flow of policies
        (with inline secrets) at once, not on the next reconnect.
        """
        with read_tx(self._engine) as conn:
            if not repo.exists(conn, cluster_fqn(node.organization, node.cluster)):
                return Revocation("the cluster was deleted", cluster_gone=True)
            key = repo.get_key(conn, grant)
            if key is None or key[0] != agent_fqn(node.organization, node.cluster):
                return Revocation("the stream's key was revoked")
        return None

    async def still_admitted(self, grant: str, node: NodeIdentity) -> Revocation | None:
        return await asyncio.to_thread(self.still_admitted_sync, grant, node)


def agent_fqn(organization: str, cluster: str) -> str:
    """The service account whose keys may subscribe for the cluster."""
    return f"{cluster_fqn(organization, cluster)}/serviceaccounts/{CLUSTER_AGENT_SA}"
