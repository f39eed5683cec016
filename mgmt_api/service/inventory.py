"""Agent inventory reports (``PUT .../inventory``) and the service lookup over them.

A report is stored in the cluster row's status JSON (the generic resources
table; no table of its own): ``namespaces``, ``state`` (with
``lastSyncTime``), ``syncTimeUs`` and a content digest. It never changes the
cluster's etag: reports are output-only data, and a user's PUT must not fail
because the agent spoke in between. Changed content is audited; identical
reports (heartbeats) only move ``lastSyncTime``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection, Engine

from mgmt_api import fqn as fqnmod
from mgmt_api.domain import inventory as inv
from mgmt_api.domain import lookup, rbac
from mgmt_api.domain import onboarding as ob
from mgmt_api.errors import ApiError, Code, invalid, not_found
from mgmt_api.schemas.inventory import InventoryReport
from mgmt_api.service import authz, onboarding_sync
from mgmt_api.service.profiles import all_children
from mgmt_api.service.resources import CLUSTER_AGENT_SA, CallContext, rfc3339
from mgmt_api.store import repo
from mgmt_api.store.engine import read_tx, write_tx


def agent_fqn(cluster_fqn: str) -> str:
    return fqnmod.child_fqn(cluster_fqn, "serviceaccounts", CLUSTER_AGENT_SA)


def _check_names(report: InventoryReport) -> None:
    """DNS-1123 names, each namespace once and each service once per namespace."""
    seen: set[str] = set()
    for i, ns in enumerate(report.namespaces):
        field = f"namespaces[{i}].name"
        fqnmod.validate_name(ns.name, field)
        if ns.name in seen:
            raise invalid(field, f"{ns.name!r} is reported twice")
        seen.add(ns.name)
        services: set[str] = set()
        for j, svc in enumerate(ns.services or []):
            sfield = f"namespaces[{i}].services[{j}].name"
            fqnmod.validate_name(svc.name, sfield)
            if svc.name in services:
                raise invalid(sfield, f"{svc.name!r} is reported twice in {ns.name}")
            services.add(svc.name)


class InventoryService:
    def __init__(self, engine: Engine, stale_after_seconds: float) -> None:
        self.engine = engine
        self.stale_after_seconds = stale_after_seconds

    def report(self, ctx: CallContext, cluster_fqn: str, report: InventoryReport) -> dict[str, Any]:
        """Replace the cluster's reported inventory; only its own agent may send it."""
        _check_names(report)
        expected = agent_fqn(cluster_fqn)
        if ctx.principal.fqn != expected:
            raise ApiError(
                Code.PERMISSION_DENIED,
                f"only the cluster's agent ({expected}) may report the inventory of "
                f"{cluster_fqn}, not {ctx.principal.fqn}",
                metadata={"permission": rbac.WRITE, "fqn": cluster_fqn, "kind": "Cluster"},
            )
        namespaces = [ns.model_dump(by_alias=True, exclude_none=True) for ns in report.namespaces]
        state = report.state.model_dump(by_alias=True, exclude_none=True)
        digest = inv.digest(namespaces, state)
        with write_tx(self.engine) as conn:
            repo.bump_revision(conn)  # serialises with config writes (onboarding status)
            authz.require(conn, ctx.principal, cluster_fqn, "Cluster", rbac.WRITE)
            cluster = repo.get(conn, cluster_fqn)
            if cluster is None:
                raise not_found(cluster_fqn)
            now = repo.now_us()
            state["lastSyncTime"] = rfc3339(now)
            status = {
                **cluster.status,
                "namespaces": namespaces,
                "state": state,
                "syncTimeUs": now,
                "digest": digest,
            }
            repo.set_status(conn, cluster_fqn, status, cluster.etag)
            if cluster.status.get("digest") != digest:
                repo.audit(
                    conn,
                    organization=fqnmod.parse(cluster_fqn).parent.partition("/")[2],
                    fqn=cluster_fqn,
                    kind="Cluster",
                    operation="REPORT_INVENTORY",
                    actor=ctx.principal.fqn,
                    message=f"agent reported {len(namespaces)} namespaces of {cluster_fqn}",
                    properties={"namespaces": len(namespaces), "provider": state.get("provider")},
                )
            config = onboarding_sync.config_of(conn, cluster_fqn)
            if config is not None:
                seen = frozenset(ns["name"] for ns in namespaces)
                onboarding_sync.refresh_status(conn, config, ob.Report(seen, now))
        return inv.state_view(status, now, self.stale_after_seconds)

    # ---- lookup ----------------------------------------------------------

    def lookup_services(
        self, ctx: CallContext, parent: str, names: list[str]
    ) -> list[dict[str, Any]]:
        """Reported services of the parent's organization that ``names`` select.

        Needs READ on ``parent``; each cluster's services are returned only if
        the caller may READ that cluster.
        """
        lookup.validate_names(names, "selector.names")
        parsed = fqnmod.parse(parent, "parent")
        organization = parsed.organization
        if organization is None:
            raise invalid("parent", f"{parent!r} is not an organization or an object in one")
        with read_tx(self.engine) as conn:
            authz.require(conn, ctx.principal, parent, parsed.kind, rbac.READ)
            if not repo.exists(conn, parent):
                raise not_found(parent)
            return self._selected(conn, ctx, organization, names)

    @staticmethod
    def _selected(
        conn: Connection, ctx: CallContext, organization: str, names: list[str]
    ) -> list[dict[str, Any]]:
        clusters = all_children(conn, organization, "Cluster")
        readable = authz.readable(
            conn, ctx.principal, organization, [c.fqn for c in clusters], "Cluster"
        )
        out = []
        for cluster in clusters:
            if cluster.fqn not in readable:
                continue
            for ns in cluster.status.get("namespaces") or []:
                if not lookup.selects(names, cluster.name, ns["name"]):
                    continue
                out += [
                    lookup.registered_service(cluster.fqn, ns["name"], svc)
                    for svc in ns.get("services") or []
                ]
        return out
