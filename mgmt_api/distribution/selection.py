"""Which stored objects reach a cluster: the one walk the snapshot and Envoy config share.

The extauthz snapshot (:mod:`mgmt_api.distribution.store_backend`), the
gateway's ``envoyconfig`` (:mod:`mgmt_api.routes.envoyconfig`) and the
policy status views must agree on which security groups reach a cluster,
otherwise Envoy would select a policy the cluster's ext_authz instances do
not have (or check a route with a policy it should not). So the rule is
written once, here:

- a group reaches cluster ``c`` when its ``namespaceSelector`` (or, if it has
  none, its workspace's) names ``c/...`` or ``*/...``;
- the namespaces it selects there are the ``rest`` of those names (``*`` for
  all).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection

from mgmt_api.store import repo


def children(conn: Connection, parent: str, kind: str) -> list[repo.Resource]:
    """Every child of ``parent`` of ``kind``."""
    return repo.all_children(conn, parent, kind)


def selects_cluster(selector: Any, cluster: str) -> bool:
    """Whether a ``{names: ["cluster/namespace", ...]}`` selector names ``cluster``."""
    names = (selector or {}).get("names") or []
    return any(str(n).split("/", 1)[0] in ("*", cluster) for n in names)


def selected_namespaces(selector: Any, cluster: str) -> tuple[str, ...]:
    """The namespaces of ``cluster`` that the selector names (``*`` for all)."""
    out = []
    for name in (selector or {}).get("names") or []:
        head, _, rest = str(name).partition("/")
        if head in ("*", cluster):
            out.append(rest or "*")
    return tuple(sorted(set(out)))


def selected_clusters(selector: Any) -> tuple[str, ...]:
    """The cluster names a selector names explicitly; ``("*",)`` when it names every cluster."""
    heads = {str(n).split("/", 1)[0] for n in (selector or {}).get("names") or []}
    return ("*",) if "*" in heads else tuple(sorted(heads))


@dataclass(frozen=True)
class ReachingGroup:
    """A security group and the selector that decides where it applies."""

    group: repo.Resource
    selector: Any


def group_selector(conn: Connection, group: repo.Resource) -> Any:
    """The group's own ``namespaceSelector``, or its workspace's when it has none."""
    own = group.spec.get("namespaceSelector")
    if own:
        return own
    workspace = repo.get(conn, group.parent)
    return workspace.spec.get("namespaceSelector") if workspace is not None else None


def groups_reaching(conn: Connection, organization: str, cluster: str) -> Iterator[ReachingGroup]:
    """Every security group of the organization that reaches ``cluster``, in FQN order."""
    for tenant in children(conn, f"organizations/{organization}", "Tenant"):
        for workspace in children(conn, tenant.fqn, "Workspace"):
            for group in children(conn, workspace.fqn, "SecurityGroup"):
                selector = group.spec.get("namespaceSelector") or workspace.spec.get(
                    "namespaceSelector"
                )
                if selects_cluster(selector, cluster):
                    yield ReachingGroup(group, selector)
