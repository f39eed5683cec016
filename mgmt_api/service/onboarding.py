"""``GET .../clusters/{cluster}/onboarding/status``: desired versus current states.

The per-namespace states are kept in the config's status JSON by
:mod:`mgmt_api.kinds.onboarding` (on config writes) and by the inventory
reports; this reads them with the cluster's sync time.
"""

from __future__ import annotations

from meshplane.kinds_contract import Kind
from mgmt_api import access as authz
from mgmt_api.access import CallContext
from mgmt_api.domain import inventory as inv
from mgmt_api.domain import rbac
from mgmt_api.domain.times import rfc3339
from mgmt_api.errors import not_found
from mgmt_api.fqn import parse
from mgmt_api.kinds import KindSettings
from mgmt_api.kinds.onboarding import config_of
from mgmt_api.schemas.onboarding import ClusterOnboardingStatus, NamespaceStatus
from mgmt_api.store import repo
from mgmt_api.store.uow import UnitOfWork


class OnboardingService:
    def __init__(self, uow: UnitOfWork, settings: KindSettings) -> None:
        self.uow = uow
        self.settings = settings

    def status(self, ctx: CallContext, cluster_fqn: str) -> ClusterOnboardingStatus:
        """Needs READ on ClusterOnboardingConfig at the cluster (inherited from it)."""
        organization = parse(cluster_fqn).parent
        with self.uow.read() as conn:
            authz.require(
                conn, ctx.principal, cluster_fqn, Kind.CLUSTER_ONBOARDING_CONFIG, rbac.READ
            )
            cluster = repo.get(conn, cluster_fqn)
            if cluster is None:
                raise not_found(cluster_fqn)
            config = config_of(conn, cluster_fqn)
        out = ClusterOnboardingStatus(
            cluster=cluster_fqn,
            tenant=self.settings.onboarding_tenant_fqn(organization),
            workspace=self.settings.onboarding_workspace_fqn(organization),
            namespaces=[],
        )
        if "syncTimeUs" in cluster.status:
            state = inv.state_view(cluster.status, repo.now_us(), self.settings.stale_after_seconds)
            out.last_sync_time = state["lastSyncTime"]
            out.stale = state["stale"]
        if config is None:
            return out
        out.fqn = config.fqn
        states = config.status.get("namespaces") or {}
        for ns in config.spec.get("namespaces") or []:
            st = states.get(ns["name"]) or {}
            transition = st.get("lastTransitionTime")
            out.namespaces.append(
                NamespaceStatus(
                    name=ns["name"],
                    desired_state=ns["desiredState"],
                    current_state=st.get("currentState", "PENDING"),
                    message=st.get("message") or None,
                    last_transition_time=None if transition is None else rfc3339(int(transition)),
                )
            )
        return out
