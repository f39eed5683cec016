"""Cluster onboarding side effects, run inside the resource write transactions.

A ClusterOnboardingConfig is an ordinary kind (CRUD, policies, audit come
from ``mgmt_api.kinds``); :class:`mgmt_api.service.resources.ResourceService`
calls these hooks in the same transaction as the write, so the config, the
onboarding tenant and workspace, the workspace's namespace selector and the
per-namespace status commit or roll back together. Every write transaction
starts by bumping the global revision row, which serialises writers on both
stores: that is what makes "at most one config per cluster" race-free.

Agent reports (:mod:`mgmt_api.service.inventory`) do not bump the revision.
They refresh the config's status under a row lock on the cluster instead;
config writes take the same lock (:func:`cluster_report`) after their own
row, and a report never waits on the config row (it skips a locked one, whose
writer then reads the new report itself), so the two cannot deadlock.

This module imports nothing from ``mgmt_api.service.resources`` (which
imports it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection

from meshplane.config_error import ConfigError
from mgmt_api import fqn as fqnmod
from mgmt_api.domain import etags
from mgmt_api.domain import onboarding as ob
from mgmt_api.errors import ApiError, Code, invalid
from mgmt_api.store import repo

KIND = "ClusterOnboardingConfig"
# Key of the onboarding workspace's status: cluster name -> selector entries
# the sync added (and so may remove).
OWNED = "onboardingSelector"


@dataclass(frozen=True, slots=True)
class OnboardingNames:
    """Names of the onboarding tenant and workspace (settings, docs/api.md)."""

    tenant: str = "onboarding"
    workspace: str = "onboarding"

    def __post_init__(self) -> None:
        """Refuse names that could never be FQN segments, at start-up.

        Otherwise the first onboarding write would fail with a 400 about a
        name no client sent.
        """
        for setting, value in (
            ("MESHPLANE_ONBOARDING_TENANT", self.tenant),
            ("MESHPLANE_ONBOARDING_WORKSPACE", self.workspace),
        ):
            try:
                fqnmod.validate_name(value, setting)
            except ApiError:
                raise ConfigError(  # from None: the API error adds nothing here
                    f"{value!r} is not a DNS-1123 label (lower-case letters, digits and '-', "
                    "starting and ending with a letter or digit, at most 63 characters)",
                    field=setting,
                ) from None

    def tenant_fqn(self, organization: str) -> str:
        return f"{organization}/tenants/{self.tenant}"

    def workspace_fqn(self, organization: str) -> str:
        return f"{self.tenant_fqn(organization)}/workspaces/{self.workspace}"


def config_of(conn: Connection, cluster_fqn: str) -> repo.Resource | None:
    """The cluster's onboarding config (at most one exists)."""
    found = repo.list_children(conn, cluster_fqn, KIND, "", 1)
    return found[0] if found else None


def cluster_report(conn: Connection, cluster_fqn: str) -> ob.Report | None:
    """The cluster's last inventory report, if it ever reported.

    Locks the cluster row, the lock every report takes first: a report being
    stored concurrently is either committed before this reads (and seen) or
    waits until this transaction ends (and then refreshes the status itself).
    """
    cluster = repo.lock(conn, cluster_fqn)
    return None if cluster is None else ob.report_of(cluster.status)


def _audit(conn: Connection, actor: str, res: repo.Resource, op: str, message: str) -> None:
    """Audited like a user's write of the object, with the reason in the properties.

    The actor is the principal whose config write caused the sync.
    """
    repo.audit(
        conn,
        organization=fqnmod.org_name(res.fqn),
        fqn=res.fqn,
        kind=res.kind,
        operation=op,
        actor=actor,
        message=message,
        properties={"reason": "cluster onboarding"},
    )


def _check(conn: Connection, config: repo.Resource, prefix: str) -> None:
    cluster = config.parent
    other = [c for c in repo.list_children(conn, cluster, KIND, "", 2) if c.fqn != config.fqn]
    if other:
        raise ApiError(
            Code.ALREADY_EXISTS,
            f"{cluster} already has an onboarding configuration ({other[0].fqn}); "
            "only one may exist per cluster: update it instead",
            metadata={"fqn": other[0].fqn},
        )
    org = repo.get(conn, fqnmod.parse(cluster).parent)
    system = set((org.spec.get("systemNamespaces") if org else None) or [])
    hits = [ns["name"] for ns in config.spec.get("namespaces") or [] if ns["name"] in system]
    if hits:
        raise invalid(
            f"{prefix}.namespaces",
            f"system namespaces cannot be onboarded: {', '.join(hits)} "
            "(the organization's systemNamespaces)",
        )


def _ensure(
    conn: Connection, fqn: str, kind: str, spec: dict[str, Any], *, actor: str, revision: int
) -> repo.Resource:
    """Get the object at ``fqn`` or create it with ``spec``.

    Created objects carry an empty access policy: they inherit the
    organization's policies and grant the config's writer nothing extra.
    """
    existing = repo.get(conn, fqn)
    if existing is not None:
        return existing
    res = repo.new_resource(fqn, kind, spec, revision=revision, creator=actor)
    repo.insert(conn, res)
    repo.insert_policy(conn, fqn, [], etags.compute(fqn + "#policy", revision))
    _audit(conn, actor, res, "CREATE", f"created onboarding {kind} {fqn}")
    return res


def sync_workspace(
    conn: Connection,
    cluster_fqn: str,
    onboarded: list[str],
    *,
    actor: str,
    names: OnboardingNames,
    revision: int,
) -> None:
    """Make the onboarding workspace select exactly ``onboarded`` of this cluster.

    The tenant and workspace are created when missing, but only when there is
    something to onboard; an emptied workspace stays for the cleanup to find.
    The entries the sync added are recorded per cluster in the workspace's
    status (``onboardingSelector``, never shown or writable by clients), so
    only those are removed later; see :func:`mgmt_api.domain.onboarding.sync_selector`.
    """
    org = fqnmod.parse(cluster_fqn).parent
    cluster = fqnmod.parse(cluster_fqn).name
    ws_fqn = names.workspace_fqn(org)
    workspace = repo.get(conn, ws_fqn)
    if workspace is None:
        if not onboarded:
            return
        description = "Namespaces onboarded by cluster onboarding configurations"
        tenant_spec = {"description": description}
        _ensure(conn, names.tenant_fqn(org), "Tenant", tenant_spec, actor=actor, revision=revision)
        spec = {"description": description, "namespaceSelector": {"names": []}}
        workspace = _ensure(conn, ws_fqn, "Workspace", spec, actor=actor, revision=revision)
    selector = workspace.spec.get("namespaceSelector") or {}
    old = list(selector.get("names") or [])
    owned_by_cluster: dict[str, list[str]] = dict(workspace.status.get(OWNED) or {})
    new, owned = ob.sync_selector(old, cluster, onboarded, owned_by_cluster.get(cluster, []))
    if owned:
        owned_by_cluster[cluster] = owned
    else:
        owned_by_cluster.pop(cluster, None)
    status = {**workspace.status, OWNED: owned_by_cluster}
    etag = workspace.etag
    if new != old:
        etag = etags.compute(ws_fqn, revision)
        spec = {**workspace.spec, "namespaceSelector": {**selector, "names": new}}
        repo.update_if_etag(
            conn,
            ws_fqn,
            workspace.etag,
            spec=spec,
            protected=workspace.protected,
            etag=etag,
            update_time=repo.now_us(),
        )
        _audit(
            conn,
            actor,
            workspace,
            "UPDATE",
            f"onboarding of {cluster_fqn}: namespaceSelector.names now {', '.join(new)}",
        )
    if status != workspace.status:
        repo.set_status(conn, ws_fqn, status, etag)


def refresh_status(conn: Connection, config: repo.Resource, report: ob.Report | None) -> None:
    """Recompute and store the config's per-namespace status (status JSON, not the etag)."""
    previous = config.status.get("namespaces") or {}
    status = {"namespaces": ob.statuses(config.spec, previous, report, repo.now_us())}
    if status != config.status:
        repo.set_status(conn, config.fqn, status, config.etag)
        config.status = status


def after_write(
    conn: Connection,
    res: repo.Resource,
    *,
    actor: str,
    names: OnboardingNames,
    revision: int,
    prefix: str,
) -> None:
    """After a create or update of any object: act if it is an onboarding config."""
    if res.kind != KIND:
        return
    _check(conn, res, prefix)
    report = cluster_report(conn, res.parent)  # takes the cluster's report lock
    onboarded = ob.onboarded(res.spec)
    sync_workspace(conn, res.parent, onboarded, actor=actor, names=names, revision=revision)
    # A report may have refreshed the status since the caller read the row.
    current = repo.get(conn, res.fqn)
    res.status = current.status if current is not None else res.status
    refresh_status(conn, res, report)


def before_delete(
    conn: Connection, fqn: str, *, actor: str, names: OnboardingNames, revision: int
) -> None:
    """Before deleting ``fqn``: drop the namespaces of the configs it takes with it."""
    kind = fqnmod.parse(fqn).kind
    if kind == KIND:
        clusters = [fqnmod.parse(fqn).parent]
    elif kind == "Cluster":
        clusters = [fqn] if config_of(conn, fqn) is not None else []
    else:  # an organization takes the workspace with it; nothing else holds configs
        return
    for cluster in clusters:
        sync_workspace(conn, cluster, [], actor=actor, names=names, revision=revision)
