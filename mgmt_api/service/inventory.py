"""Agent inventory reports (``PUT .../inventory``) and the service lookup over them.

A report is stored in the cluster row's status JSON (the generic resources
table; no table of its own): ``namespaces``, ``state`` (with
``lastSyncTime``), ``syncTimeUs`` and a content digest. It never changes the
cluster's etag: reports are output-only data, and a user's PUT must not fail
because the agent spoke in between. Changed content is audited; identical
reports (heartbeats) only move ``lastSyncTime``.

Reports do not bump the store revision. The revision wakes the policy
distribution, which recompiles every subscribed cluster's snapshot, and
nothing it compiles reads reported data (``mgmt_api.service.enforcement``
and ``mgmt_api.compiler`` read specs only); neither does the bearer cache the
revision also guards. Concurrent reports of one cluster are serialised by a
row lock on the cluster instead (see :mod:`mgmt_api.kinds.onboarding`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from sqlalchemy.engine import Connection

from meshplane.kinds_contract import Kind
from mgmt_api import access as authz
from mgmt_api import fqn as fqnmod
from mgmt_api.access import CallContext
from mgmt_api.domain import cluster_accounts, listing, lookup, rbac, workload_attest
from mgmt_api.domain import inventory as inv
from mgmt_api.domain import onboarding as ob
from mgmt_api.domain.times import rfc3339
from mgmt_api.errors import ApiError, Code, invalid, not_found
from mgmt_api.kinds import onboarding
from mgmt_api.schemas.inventory import ClusterStateView, InventoryReport, RegisteredService
from mgmt_api.service.authn import principal_for
from mgmt_api.store import repo
from mgmt_api.store.uow import Tx, UnitOfWork

log = logging.getLogger(__name__)

# Clusters whose status (the whole reported inventory, workloads included)
# one lookup step loads at once: bounds memory, and a full page stops early.
LOOKUP_BATCH = 16


#: Audited when the service-account issuer an agent reports changes (docs/mesh.md, "Trust model").
CHANGE_ISSUER = "CHANGE_WORKLOAD_ISSUER"


def _audit_issuer_change(
    tx: Tx, cluster_fqn: str, before: dict[str, Any], state: dict[str, Any]
) -> None:
    """The reported issuer is what workload tokens are verified against: a change of it
    (a first report, a key rotation, or someone holding the agent key) is audited and
    logged, naming the issuer and its key ids, never a key."""
    old = (before.get("state") or {}).get("serviceAccountIssuer")
    new = state.get("serviceAccountIssuer")
    if old == new:
        return
    kids = sorted(str(k.get("kid", "")) for k in ((new or {}).get("jwks") or {}).get("keys", []))
    issuer = (new or {}).get("issuer")
    tx.audit(
        cluster_fqn,
        Kind.CLUSTER,
        CHANGE_ISSUER,
        f"agent reported the service-account issuer {issuer!r} (key ids {kids}) of {cluster_fqn}",
        issuer=issuer,
        keyIds=kids,
    )
    log.warning(
        "the service-account issuer reported for the cluster changed",
        extra={"cluster": cluster_fqn, "issuer": issuer, "keyIds": kids},
    )


def _check_names(report: InventoryReport) -> None:
    """DNS-1123 names, each namespace once, each service and pod once per namespace,
    and the issuer a public JWKS within its caps."""
    issuer = report.state.service_account_issuer
    if issuer is not None:
        problem = workload_attest.issuer_problem(issuer)
        if problem is not None:
            member, message = problem
            raise invalid(".".join(filter(None, ("state.serviceAccountIssuer", member))), message)
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
        pods: set[str] = set()
        for j, pod in enumerate(ns.pods or []):
            pfield = f"namespaces[{i}].pods[{j}].name"
            if pod.name in pods:
                raise invalid(pfield, f"{pod.name!r} is reported twice in {ns.name}")
            pods.add(pod.name)


class InventoryService:
    def __init__(
        self,
        uow: UnitOfWork,
        stale_after_seconds: float,
        reported: Callable[[str], None] = lambda _fqn: None,
    ) -> None:
        """``reported(cluster_fqn)`` hears of every stored report (the attestation's
        read model drops its copy of the cluster's pods)."""
        self.uow = uow
        self.stale_after_seconds = stale_after_seconds
        self._reported = reported

    def report(
        self, ctx: CallContext, cluster_fqn: str, report: InventoryReport
    ) -> ClusterStateView:
        """Replace the cluster's reported inventory; only its own agent may send it."""
        _check_names(report)
        # Admitted by the cluster-accounts table, not by a role: the agent holds none.
        refused = cluster_accounts.refusal(
            ctx.principal.fqn, cluster_fqn, cluster_accounts.INVENTORY_REPORT
        )
        if refused is not None:
            raise ApiError(
                Code.PERMISSION_DENIED,
                f"only the cluster's agent ({fqnmod.agent_fqn(cluster_fqn)}) may report the "
                f"inventory of {cluster_fqn}: {refused}",
                metadata={"permission": rbac.WRITE, "fqn": cluster_fqn, "kind": Kind.CLUSTER},
            )
        namespaces = [ns.model_dump(by_alias=True, exclude_none=True) for ns in report.namespaces]
        state = report.state.model_dump(by_alias=True, exclude_none=True)
        digest = inv.digest(namespaces, state)
        with self.uow.write(ctx.principal.fqn, bump=False) as tx:
            conn = tx.conn
            # The row lock serialises reports of this cluster (and config
            # writes, which take it too); the revision stays as it is.
            cluster = repo.lock(conn, cluster_fqn)
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
            _audit_issuer_change(tx, cluster_fqn, cluster.status, state)
            if cluster.status.get("digest") != digest:
                tx.audit(
                    cluster_fqn,
                    Kind.CLUSTER,
                    "REPORT_INVENTORY",
                    f"agent reported {len(namespaces)} namespaces of {cluster_fqn}",
                    namespaces=len(namespaces),
                    provider=state.get("provider"),
                )
            # Skipped when a config write holds the row: that writer reads
            # this report once we commit (it waits on the cluster lock).
            config = repo.first_child_unless_locked(
                conn, cluster_fqn, Kind.CLUSTER_ONBOARDING_CONFIG
            )
            if config is not None:
                onboarding.refresh_status(tx, config, ob.report_of(status))
        self._reported(cluster_fqn)
        return ClusterStateView.model_validate(
            inv.state_view(status, now, self.stale_after_seconds)
        )

    def report_json(self, cluster_fqn: str, body: bytes) -> str:
        """A report that arrived over the agent's tunnel (already authenticated as the
        cluster's agent): stored exactly as ``PUT .../inventory`` stores it, with the
        agent's principal. Returns "" or why it was refused (sent back to the agent)."""
        try:
            report = InventoryReport.model_validate_json(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            return f"invalid report: {where}: {first.get('msg', 'invalid')}"
        try:
            with self.uow.read() as conn:
                agent = principal_for(conn, fqnmod.agent_fqn(cluster_fqn), "serviceAccount")
            self.report(CallContext(agent, ""), cluster_fqn, report)
        except ApiError as exc:
            return exc.message
        return ""

    # ---- lookup ----------------------------------------------------------

    def lookup_services(
        self,
        ctx: CallContext,
        parent: str,
        names: list[str],
        *,
        page_size: int = listing.DEFAULT_PAGE_SIZE,
        page_token: str = "",
    ) -> tuple[list[RegisteredService], str]:
        """One page of the reported services of the parent's organization that ``names`` select.

        Needs READ on ``parent``; each cluster's services are returned only if
        the caller may READ that cluster. Returns the page and the token of the
        next one (empty when this is the last).
        """
        lookup.validate_names(names, "selector.names")
        parsed = fqnmod.parse(parent, "parent")
        organization = parsed.organization
        if organization is None:
            raise invalid("parent", f"{parent!r} is not an organization or an object in one")
        after = listing.decode_token(page_token)
        start = lookup.service_key(after, organization, "pageToken") if after else None
        with self.uow.read() as conn:
            authz.require(conn, ctx.principal, parent, parsed.kind, rbac.READ)
            if not repo.exists(conn, parent):
                raise not_found(parent)
            return self._selected(conn, ctx, organization, names, page_size=page_size, start=start)

    @staticmethod
    def _selected(
        conn: Connection,
        ctx: CallContext,
        organization: str,
        names: list[str],
        *,
        page_size: int,
        start: lookup.ServiceKey | None,
    ) -> tuple[list[RegisteredService], str]:
        """Walk the clusters in FQN order, a few at a time, until the page is full.

        Only the clusters a pattern can name are read, their status only if
        the caller may read them, and the walk stops at the first result past
        the page, so the cost follows the page rather than the organization.
        """
        only = lookup.cluster_segments(names)
        out: list[RegisteredService] = []
        last: lookup.ServiceKey | None = None
        # From the token's cluster on: it may have services after the token's one.
        cursor, inclusive = (start[0], True) if start else ("", False)
        while True:
            batch = repo.child_names(
                conn,
                organization,
                Kind.CLUSTER,
                after=cursor,
                limit=LOOKUP_BATCH,
                names=only,
                inclusive=inclusive,
            )
            fqns = [fqn for fqn, _ in batch]
            readable = authz.readable(conn, ctx.principal, organization, fqns, Kind.CLUSTER)
            statuses = repo.statuses_of(conn, [f for f in fqns if f in readable])
            for fqn, name in batch:
                for ns in sorted(statuses.get(fqn, {}).get("namespaces") or [], key=_name):
                    if not lookup.selects(names, name, ns["name"]):
                        continue
                    for svc in sorted(ns.get("services") or [], key=_name):
                        key = (fqn, ns["name"], svc["name"])
                        if start is not None and key <= start:
                            continue
                        if len(out) == page_size:  # one more exists: end the page here
                            assert last is not None
                            return out, listing.encode_token(lookup.service_fqn(last))
                        out.append(
                            RegisteredService.model_validate(
                                lookup.registered_service(fqn, ns["name"], svc)
                            )
                        )
                        last = key
            if len(batch) < LOOKUP_BATCH:
                return out, ""
            cursor, inclusive = batch[-1][0], False


def _name(item: dict[str, Any]) -> str:
    return str(item["name"])
