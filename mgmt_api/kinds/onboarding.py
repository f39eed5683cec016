"""ClusterOnboardingConfig and the onboarding it drives.

A cluster has at most one onboarding configuration. Writing it, in the same
transaction: the organization's onboarding tenant and workspace are created
when missing, the workspace's namespace selector gains (or loses) exactly the
cluster's ``DESIRED_ONBOARDED`` namespaces, and the config's per-namespace
status is recomputed from the cluster's last inventory report.

Every write transaction starts by bumping the global revision row, which
serialises writers on both stores: that is what makes "at most one config
per cluster" race-free. Agent reports (:mod:`mgmt_api.service.inventory`) do
not bump the revision. They refresh the config's status under a row lock on
the cluster instead; config writes take the same lock (:func:`cluster_report`)
after their own row, and a report never waits on the config row (it skips a
locked one, whose writer then reads the new report itself), so the two
cannot deadlock.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field
from sqlalchemy.engine import Connection

from meshplane.kinds_contract import Kind
from mgmt_api import fqn as fqnmod
from mgmt_api.domain import onboarding as ob
from mgmt_api.errors import ApiError, Code, invalid
from mgmt_api.kinds.base import Behaviour, KindDef, Write, WriteEnv, create_object
from mgmt_api.schemas.base import ApiModel, DnsLabel
from mgmt_api.schemas.resources import Meta
from mgmt_api.store import repo
from mgmt_api.store.uow import Tx

# Key of the onboarding workspace's status: cluster name -> selector entries
# the sync added (and so may remove).
OWNED = "onboardingSelector"
REASON = {"reason": "cluster onboarding"}


class NamespaceConfig(ApiModel):
    name: DnsLabel = Field(description="A namespace of the cluster (DNS-1123 label).")
    desired_state: ob.NamespaceDesiredState


class ClusterOnboardingConfig(Meta):
    """Desired onboarding state per namespace of one cluster; one per cluster."""

    namespaces: list[NamespaceConfig] = Field(max_length=1000)


def config_of(conn: Connection, cluster_fqn: str) -> repo.Resource | None:
    """The cluster's onboarding config (at most one exists)."""
    found = repo.list_children(conn, cluster_fqn, Kind.CLUSTER_ONBOARDING_CONFIG, "", 1)
    return found[0] if found else None


def cluster_report(conn: Connection, cluster_fqn: str) -> ob.Report | None:
    """The cluster's last inventory report, if it ever reported.

    Locks the cluster row, the lock every report takes first: a report being
    stored concurrently is either committed before this reads (and seen) or
    waits until this transaction ends (and then refreshes the status itself).
    """
    cluster = repo.lock(conn, cluster_fqn)
    return None if cluster is None else ob.report_of(cluster.status)


def _check(conn: Connection, config: repo.Resource, prefix: str) -> None:
    cluster = config.parent
    other = [
        c
        for c in repo.list_children(conn, cluster, Kind.CLUSTER_ONBOARDING_CONFIG, "", 2)
        if c.fqn != config.fqn
    ]
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


def _ensure(env: WriteEnv, fqn: str, kind: str, spec: dict[str, Any]) -> repo.Resource:
    """Get the object at ``fqn`` or create it with ``spec``.

    Created objects carry an empty access policy: they inherit the
    organization's policies and grant the config's writer nothing extra.
    """
    existing = repo.get(env.tx.conn, fqn)
    if existing is not None:
        return existing
    res = create_object(env, kind, fqn, spec, creator_is_admin=False)
    assert res is not None  # absent just above, in the same serialised transaction
    env.tx.audit(fqn, kind, "CREATE", f"created onboarding {kind} {fqn}", **REASON)
    return res


def sync_workspace(env: WriteEnv, cluster_fqn: str, onboarded: list[str]) -> None:
    """Make the onboarding workspace select exactly ``onboarded`` of this cluster.

    The tenant and workspace are created when missing, but only when there is
    something to onboard; an emptied workspace stays for the cleanup to find.
    The entries the sync added are recorded per cluster in the workspace's
    status (``onboardingSelector``, never shown or writable by clients), so
    only those are removed later; see :func:`mgmt_api.domain.onboarding.sync_selector`.
    """
    conn, settings = env.tx.conn, env.settings
    org = fqnmod.parse(cluster_fqn).parent
    cluster = fqnmod.parse(cluster_fqn).name
    ws_fqn = settings.onboarding_workspace_fqn(org)
    workspace = repo.get(conn, ws_fqn)
    if workspace is None:
        if not onboarded:
            return
        description = "Namespaces onboarded by cluster onboarding configurations"
        _ensure(env, settings.onboarding_tenant_fqn(org), Kind.TENANT, {"description": description})
        spec = {"description": description, "namespaceSelector": {"names": []}}
        workspace = _ensure(env, ws_fqn, Kind.WORKSPACE, spec)
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
        etag = env.tx.etag(ws_fqn)
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
        env.tx.audit(
            ws_fqn,
            workspace.kind,
            "UPDATE",
            f"onboarding of {cluster_fqn}: namespaceSelector.names now {', '.join(new)}",
            **REASON,
        )
    if status != workspace.status:
        repo.set_status(conn, ws_fqn, status, etag)


def refresh_status(tx: Tx, config: repo.Resource, report: ob.Report | None) -> None:
    """Recompute and store the config's per-namespace status (status JSON, not the etag)."""
    previous = config.status.get("namespaces") or {}
    status = {"namespaces": ob.statuses(config.spec, previous, report, repo.now_us())}
    if status != config.status:
        repo.set_status(tx.conn, config.fqn, status, config.etag)
        config.status = status


def offboard_cluster(env: WriteEnv, cluster_fqn: str) -> None:
    """Drop the cluster's namespaces from the onboarding workspace (its config is going)."""
    if config_of(env.tx.conn, cluster_fqn) is not None:
        sync_workspace(env, cluster_fqn, [])


class OnboardingBehaviour(Behaviour):
    def validate(self, write: Write) -> None:
        """Namespace names are DNS-1123 labels, each listed once; the name ``status``
        is reserved for ``.../onboarding/status``. System namespaces are checked
        in the write transaction: they live on the organization."""
        if write.name == "status":
            raise invalid("name", "'status' is reserved (GET .../onboarding/status)")
        seen: set[str] = set()
        for i, ns in enumerate(write.spec.get("namespaces") or []):
            field = f"{write.prefix}.namespaces[{i}].name"
            fqnmod.validate_name(ns.get("name", ""), field)
            if ns["name"] in seen:
                raise invalid(field, f"{ns['name']!r} is listed twice")
            seen.add(ns["name"])

    def after_write(self, env: WriteEnv, write: Write, res: repo.Resource) -> dict[str, Any]:
        conn = env.tx.conn
        _check(conn, res, write.prefix)
        report = cluster_report(conn, res.parent)  # takes the cluster's report lock
        sync_workspace(env, res.parent, ob.onboarded(res.spec))
        # A report may have refreshed the status since the caller read the row.
        current = repo.get(conn, res.fqn)
        res.status = current.status if current is not None else res.status
        refresh_status(env.tx, res, report)
        return {}

    def before_delete(self, env: WriteEnv, fqn: str) -> None:
        sync_workspace(env, fqnmod.parse(fqn).parent, [])


KIND = KindDef(
    Kind.CLUSTER_ONBOARDING_CONFIG,
    ClusterOnboardingConfig,
    behaviour=OnboardingBehaviour(),
)
