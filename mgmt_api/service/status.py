"""Has my change reached the proxies? The per-instance status views.

``GET .../clusters/{cluster}/status`` shows, per subscribed instance of the
cluster (ratelimit and extauthz instances on the policy stream, gateway
Envoys on ADS), the applied snapshot version, whether the last snapshot was ACKed or
NACKed (with the error), the last contact and whether the instance is stale,
next to the version the cluster's current policies compile to, so "up to
date" is answerable, and its mesh CA (``meshCa``: the rotation's phase, the
CAs' fingerprints and expiry, how many sidecars hold a certificate of the
newest CA; :meth:`~mgmt_api.service.mesh_ca.MeshCaStore.view`), and its
``warnings``: references to objects the cluster does not have
(:mod:`mgmt_api.service.references`), accepted but never shown as applied
without saying so. The
policy-side views show the same for one policy, listing every instance that
carries it: the kinds its content compiles into
(:data:`~mgmt_api.service.enforcement.POLICY_REACH`: the service's instances
and the gateways) of a BackendTrafficPolicy's cluster, or of each cluster an
ExtAuthzPolicy's or SecuritySetting's group reaches. Each needs READ on the
object it is asked for.

The desired versions come from the read model (:mod:`mgmt_api.service.enforcement`),
the instances from the registry the distribution stream feeds
(:mod:`mgmt_api.service.instances`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import NotRequired, TypedDict

from mgmt_api import access
from mgmt_api import fqn as fqnmod
from mgmt_api.access import CallContext
from mgmt_api.compiler.extauthz import policy_name
from mgmt_api.compiler.identity_limits import ClaimLimitErrorJson
from mgmt_api.domain import rbac
from mgmt_api.errors import ApiError, Code, not_found
from mgmt_api.service.enforcement import EnforcementService
from mgmt_api.service.instances import SubscriberRegistry
from mgmt_api.service.mesh_ca import MeshCaStore, MeshCaView
from mgmt_api.store import repo
from mgmt_api.store.uow import UnitOfWork

log = logging.getLogger(__name__)

# The views are TypedDicts rather than response models: the routes return them
# as they are, so the JSON keeps the order built here (a model would reorder
# inherited fields) and the OpenAPI document stays as it was.
InstanceView = dict[str, object]  # InstanceStatus.to_json plus "upToDate"


class ClusterStatusView(TypedDict):
    """``GET .../clusters/{cluster}/status``."""

    cluster: str
    desiredVersions: dict[str, str]
    instances: list[InstanceView]
    compileErrors: NotRequired[dict[str, str]]
    policyErrors: NotRequired[list[ClaimLimitErrorJson]]
    warnings: NotRequired[list[dict[str, str]]]
    meshCa: NotRequired[MeshCaView]


class ReachView(TypedDict):
    """One cluster as a policy sees it (see :meth:`StatusService._reach_view`)."""

    cluster: str
    desiredVersion: str
    desiredVersions: dict[str, str]
    instances: list[InstanceView]
    compileErrors: NotRequired[dict[str, str]]
    compileError: NotRequired[str]
    # Set only in a policy's own view (PolicyStatusView).
    policyErrors: NotRequired[list[ClaimLimitErrorJson]]
    warnings: NotRequired[list[dict[str, str]]]


class PolicyStatusView(ReachView):
    """A BackendTrafficPolicy's status: these keys, then its cluster's
    :class:`ReachView` (the JSON keeps the order the view is built in)."""

    fqn: str
    reaches: list[str]


class GroupObjectStatusView(TypedDict):
    """A security group's object: every cluster the group reaches."""

    fqn: str
    reaches: list[str]
    clusters: list[ReachView]
    policyName: NotRequired[str]  # ExtAuthzPolicy only


class StatusService:
    def __init__(
        self,
        uow: UnitOfWork,
        enforcement: EnforcementService,
        registry: SubscriberRegistry | None,
        mesh_ca: MeshCaStore | None = None,
    ) -> None:
        self.uow = uow
        self.enforcement = enforcement
        self.registry = registry  # None: distribution is off on this server
        self.mesh_ca = mesh_ca

    def _readable(self, ctx: CallContext, fqn: str) -> SubscriberRegistry:
        """READ on ``fqn`` (which must exist), and the registry."""
        kind = fqnmod.parse(fqn).kind
        with self.uow.read() as conn:
            access.require(conn, ctx.principal, fqn, kind, rbac.READ)
            if not repo.exists(conn, fqn):
                raise not_found(fqn)
        if self.registry is None:
            raise ApiError(
                Code.FAILED_PRECONDITION, "policy distribution is disabled on this server"
            )
        return self.registry

    def _desired(self, organization: str, cluster: str) -> tuple[dict[str, str], dict[str, str]]:
        """(kind → the version the cluster's policies compile to, kind → compile error)."""
        desired: dict[str, str] = {}
        errors: dict[str, str] = {}
        for kind in self.enforcement.kinds:
            try:
                desired[kind] = self.enforcement.desired_version(kind, organization, cluster)
            except Exception as exc:
                # A stored object the compiler rejects (written around the
                # API's validation): streams fail and subscribers keep their
                # last good snapshot; the status says why instead of a 500.
                log.exception("cannot compile the cluster's snapshot", extra={"kind": kind})
                desired[kind] = ""
                errors[kind] = f"{type(exc).__name__}: {str(exc)[:500]}"
        return desired, errors

    @staticmethod
    def _instances(
        registry: SubscriberRegistry,
        organization: str,
        cluster: str,
        desired: dict[str, str],
        kinds: Sequence[str] | None = None,
    ) -> list[InstanceView]:
        """The cluster's instances of ``kinds`` in that order (default: every kind
        ``desired`` names, by kind name)."""
        now = time.time()
        order = {kind: i for i, kind in enumerate(kinds if kinds is not None else sorted(desired))}
        out = []
        for status in sorted(
            registry.for_cluster(organization, cluster, now),
            key=lambda s: (order.get(s.node.kind, -1), s.node.instance),
        ):
            if status.node.kind not in order:
                continue
            view = status.to_json(now, registry.stale_after)
            view["upToDate"] = status.applied_version == desired.get(status.node.kind)
            out.append(view)
        return out

    def _cluster_view(
        self, registry: SubscriberRegistry, organization: str, cluster: str
    ) -> ClusterStatusView:
        desired, errors = self._desired(organization, cluster)
        out: ClusterStatusView = {
            "cluster": fqnmod.cluster_fqn(organization, cluster),
            "desiredVersions": desired,
            "instances": self._instances(registry, organization, cluster, desired),
        }
        if errors:
            out["compileErrors"] = errors
        policy_errors = self._policy_errors(organization, cluster)
        if policy_errors:
            out["policyErrors"] = policy_errors
        warnings = self._warnings(organization, cluster)
        if warnings:
            out["warnings"] = warnings
        if self.mesh_ca is not None:
            out["meshCa"] = self.mesh_ca.view(organization, cluster)
        return out

    def _policy_errors(self, organization: str, cluster: str) -> list[ClaimLimitErrorJson]:
        """Objects that compile but cannot be enforced as written (``{policy, route,
        message}``); an error computing them is logged, never a failed status."""
        try:
            return self.enforcement.policy_errors(organization, cluster)
        except Exception:
            log.exception("cannot check the cluster's policies")
            return []

    def _warnings(
        self, organization: str, cluster: str, fqn: str | None = None
    ) -> list[dict[str, str]]:
        """References to objects the cluster does not have (of ``fqn`` only, if
        given): accepted objects that cannot work as written. Like
        :meth:`_policy_errors`, a failure to compute them is logged, never a
        failed status."""
        try:
            dangling = self.enforcement.dangling(organization, cluster)
        except Exception:
            log.exception("cannot check the cluster's references")
            return []
        return [d.to_json() for d in dangling if fqn is None or d.fqn == fqn]

    def _reach_view(
        self, registry: SubscriberRegistry, organization: str, cluster: str, kinds: Sequence[str]
    ) -> ReachView:
        """One cluster as a policy sees it: the instances of every kind that carries it.

        ``desiredVersion`` and ``compileError`` are the first kind's (the
        service's snapshot), as before the gateways were listed here."""
        desired, errors = self._desired(organization, cluster)
        out: ReachView = {
            "cluster": fqnmod.cluster_fqn(organization, cluster),
            "desiredVersion": desired[kinds[0]],
            "desiredVersions": {kind: desired[kind] for kind in kinds},
            "instances": self._instances(registry, organization, cluster, desired, kinds),
        }
        own = {kind: errors[kind] for kind in kinds if kind in errors}
        if own:
            out["compileErrors"] = own
            out["compileError"] = next(iter(own.values()))
        return out

    def cluster(self, ctx: CallContext, organization: str, cluster: str) -> ClusterStatusView:
        registry = self._readable(ctx, fqnmod.cluster_fqn(organization, cluster))
        return self._cluster_view(registry, organization, cluster)

    def traffic_policy(self, ctx: CallContext, fqn: str) -> PolicyStatusView:
        """A snapshot holds all of the cluster's policies, so "applied" means "this
        policy's current content is live there"."""
        registry = self._readable(ctx, fqn)
        parsed = fqnmod.parse(fqn)
        organization = parsed.name_in("organizations") or ""
        cluster = parsed.name_in("clusters") or ""
        kinds = self.enforcement.reach(parsed.kind)
        view: PolicyStatusView = {
            "fqn": fqn,
            "reaches": list(kinds),
            **self._reach_view(registry, organization, cluster, kinds),
        }
        own = [e for e in self._policy_errors(organization, cluster) if e["policy"] == fqn]
        if own:
            view["policyErrors"] = own
        warnings = self._warnings(organization, cluster, fqn)
        if warnings:
            view["warnings"] = warnings
        return view

    def group_object(self, ctx: CallContext, fqn: str) -> GroupObjectStatusView:
        """An object of a security group (a SecuritySetting, an ExtAuthzPolicy): every
        cluster the group reaches, with the instances that carry the object there."""
        registry = self._readable(ctx, fqn)
        parsed = fqnmod.parse(fqn)
        organization = parsed.name_in("organizations") or ""
        clusters = self.enforcement.clusters_reached(organization, parsed.parent)
        kinds = self.enforcement.reach(parsed.kind)
        return {
            "fqn": fqn,
            "reaches": list(kinds),
            "clusters": [self._reach_view(registry, organization, c, kinds) for c in clusters],
        }

    def ext_authz_policy(self, ctx: CallContext, fqn: str) -> GroupObjectStatusView:
        """:meth:`group_object`, plus the name the ext_authz file gives the policy
        (what a route's ``meshplane.policy`` context extension must say)."""
        view = self.group_object(ctx, fqn)
        parsed = fqnmod.parse(fqn)
        view["policyName"] = policy_name(parsed.parent, parsed.name)
        return view
