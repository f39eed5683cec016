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
verified exactly as the REST API verifies it, so a subscriber can never ask
for another cluster's snapshot. The token is checked when the stream opens;
revoking the key or deleting the cluster takes effect on the next connect.

Both run the blocking store reads in a worker thread so the event loop that
also serves REST keeps answering.
"""

from __future__ import annotations

import asyncio
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
from mgmt_api.distribution.server import AuthError, Compiled
from mgmt_api.service.authn import service_account_ttl
from mgmt_api.service.resources import CLUSTER_AGENT_SA
from mgmt_api.store import repo
from mgmt_api.store.engine import read_tx
from ratelimit.store.switches import SWITCHES_FILE

_PAGE = 500


def cluster_fqn(organization: str, cluster: str) -> str:
    return f"organizations/{organization}/clusters/{cluster}"


def _children(conn: Connection, parent: str, kind: str) -> list[repo.Resource]:
    out: list[repo.Resource] = []
    after = ""
    while True:
        batch = repo.list_children(conn, parent, kind, after, _PAGE)
        out.extend(batch)
        if len(batch) < _PAGE:
            return out
        after = batch[-1].fqn


def _selects_cluster(selector: Any, cluster: str) -> bool:
    names = (selector or {}).get("names") or []
    return any(str(n).split("/", 1)[0] in ("*", cluster) for n in names)


def traffic_policies(
    conn: Connection, organization: str, cluster: str
) -> list[BackendTrafficPolicy]:
    """The cluster's stored BackendTrafficPolicies, parsed by the compiler's model."""
    policies = []
    for res in _children(conn, cluster_fqn(organization, cluster), "BackendTrafficPolicy"):
        doc = {k: res.spec[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in res.spec}
        policies.append(BackendTrafficPolicy.model_validate(doc))
    return policies


def extauthz_policies(
    conn: Connection, organization: str, cluster: str
) -> list[tuple[str, dict[str, Any]]]:
    """(ext_authz name, stored spec) of the policies of groups that reach ``cluster``."""
    out: list[tuple[str, dict[str, Any]]] = []
    for tenant in _children(conn, f"organizations/{organization}", "Tenant"):
        for workspace in _children(conn, tenant.fqn, "Workspace"):
            for group in _children(conn, workspace.fqn, "SecurityGroup"):
                selector = group.spec.get("namespaceSelector") or workspace.spec.get(
                    "namespaceSelector"
                )
                if not _selects_cluster(selector, cluster):
                    continue
                for policy in _children(conn, group.fqn, "ExtAuthzPolicy"):
                    name = extauthz_compiler.policy_name(group.fqn, policy.name)
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

    def authenticate_sync(self, token: str, node: NodeIdentity) -> None:
        expected = (
            f"{cluster_fqn(node.organization, node.cluster)}/serviceaccounts/{CLUSTER_AGENT_SA}"
        )
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
                    jwk, token, self._clock(), service_account_ttl(conn, owner)
                )
        except tokens.TokenError as exc:
            raise AuthError(str(exc)) from None

    async def authenticate(self, token: str, node: NodeIdentity) -> None:
        await asyncio.to_thread(self.authenticate_sync, token, node)
