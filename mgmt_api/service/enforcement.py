"""What a cluster must enforce: the one read model behind every artifact compiled for it.

The ratelimit snapshot, the extauthz snapshot, the gateway's Envoy config
(``.../envoyconfig``) and the status views must agree on which objects reach
a cluster, otherwise Envoy would select a policy the cluster's ext_authz
instances do not have, or check a route with a policy it should not. So the
store is read for a cluster in exactly one place, :func:`read_cluster`, and
everything else compiles from its :class:`ClusterReadModel`:

- a BackendTrafficPolicy reaches the cluster it is stored under;
- a security group reaches cluster ``c`` when its ``namespaceSelector`` (or,
  if it has none, its workspace's) names ``c/...`` or ``*/...``; the
  namespaces it selects there are the rest of those names (``*`` for all);
  its ExtAuthzPolicies and SecuritySettings come with it;
- the cluster's own ``rateLimit`` switches (counter store, failure mode);
- the cluster's gateway knobs (filter timeouts and failure modes, circuit
  breakers), parsed on use into :class:`envoy_config.GatewaySettings`.

Every snapshot is validated with the receiving service's own loader
(``ratelimit.contract``, ``extauthz.contract``) before anyone may send it: a
compiler bug must show as a compile error in the status, never as a NACK
storm on every instance.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from sqlalchemy.engine import Connection

from extauthz import contract as extauthz_contract
from meshplane.gateway_contract import GATEWAY_KIND, GatewayNode
from meshplane.kinds_contract import Kind
from meshplane.sidecar_contract import SIDECAR_KIND
from mgmt_api import access
from mgmt_api import fqn as fqnmod
from mgmt_api.access import CallContext
from mgmt_api.compiler import envoy_config, gateway_xds, key_material, mesh_authz, sidecar_xds
from mgmt_api.compiler import extauthz as extauthz_compiler
from mgmt_api.compiler.http_route import Backend, HTTPRoute
from mgmt_api.compiler.identity_limits import (
    ClaimLimitErrorJson,
    ClaimLimits,
    compile_claim_limits,
)
from mgmt_api.compiler.ratelimit import render_rls_files
from mgmt_api.compiler.references import DanglingReference
from mgmt_api.compiler.traffic_policy import BackendTrafficPolicy
from mgmt_api.domain import rbac
from mgmt_api.domain.uris import check_grpc_uri
from mgmt_api.errors import not_found
from mgmt_api.kinds.security_setting import AuthorizationSettings, SecuritySetting
from mgmt_api.service import clusters, references
from mgmt_api.service.sidecars import SidecarDirectory
from mgmt_api.store import repo
from mgmt_api.store.uow import UnitOfWork
from ratelimit import contract as ratelimit_contract

RATELIMIT = "ratelimit"
EXTAUTHZ = "extauthz"


# ---- selection: which security groups reach a cluster --------------------------------


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
    workspace_selector: Any = None  # its workspace's, for mode WORKSPACE


def group_selector(conn: Connection, group: repo.Resource) -> Any:
    """The group's own ``namespaceSelector``, or its workspace's when it has none."""
    own = group.spec.get("namespaceSelector")
    if own:
        return own
    workspace = repo.get(conn, group.parent)
    return workspace.spec.get("namespaceSelector") if workspace is not None else None


def groups_reaching(conn: Connection, organization: str, cluster: str) -> Iterator[ReachingGroup]:
    """Every security group of the organization that reaches ``cluster``, in FQN order."""
    for tenant in repo.all_children(conn, fqnmod.organization_fqn(organization), Kind.TENANT):
        for workspace in repo.all_children(conn, tenant.fqn, Kind.WORKSPACE):
            for group in repo.all_children(conn, workspace.fqn, Kind.SECURITY_GROUP):
                selector = group.spec.get("namespaceSelector") or workspace.spec.get(
                    "namespaceSelector"
                )
                if selects_cluster(selector, cluster):
                    yield ReachingGroup(group, selector, workspace.spec.get("namespaceSelector"))


# ---- the read model --------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterReadModel:
    """Everything compiled for one cluster, read in one transaction."""

    organization: str
    cluster: str
    cluster_fqn: str
    traffic_specs: tuple[tuple[str, Mapping[str, Any]], ...]  # (fqn, stored spec)
    extauthz_policies: tuple[tuple[str, extauthz_compiler.StoredPolicy], ...]  # (name, spec)
    ext_authz_routes: tuple[envoy_config.ExtAuthzRoute, ...]
    rate_limit: envoy_config.StoredRateLimit | None  # the cluster's rateLimit switches
    notes: tuple[str, ...] = field(default=())  # what cannot be enforced as written
    http_route_specs: tuple[tuple[str, Mapping[str, Any]], ...] = field(default=())
    backend_specs: tuple[tuple[str, Mapping[str, Any]], ...] = field(default=())
    gateway_spec: envoy_config.GatewayKnobs = field(
        default_factory=envoy_config.GatewayKnobs
    )  # the spec's gateway knobs
    trust_domain: str = ""  # the sidecars' SPIFFE trust domain (own, or the default)
    #: Every SecuritySetting that reaches the cluster, as sidecars enforce it.
    mesh_settings: tuple[mesh_authz.MeshSetting, ...] = field(default=())
    #: References to objects the cluster does not have (a policy targeting a
    #: route nobody created): accepted, but the status and envoyconfig warn.
    dangling: tuple[DanglingReference, ...] = field(default=())

    def gateway(self) -> envoy_config.GatewaySettings:
        """The gateway knobs, parsed on use for the reason :meth:`traffic_policies` gives."""
        return envoy_config.gateway_settings(self.gateway_spec)

    def traffic_policies(self) -> list[tuple[str, BackendTrafficPolicy]]:
        """The BackendTrafficPolicies, parsed by the compiler's model.

        Parsed on use, not when read: a stored policy the model refuses (written
        around the API) fails what compiles from it (the ratelimit snapshot, the
        gateway config), never the cluster's unrelated extauthz snapshot.
        """
        return [
            (fqn, BackendTrafficPolicy.model_validate(spec)) for fqn, spec in self.traffic_specs
        ]

    def http_routes(self) -> list[tuple[str, HTTPRoute]]:
        """The gateway's HTTPRoutes, parsed on use as :meth:`traffic_policies` are."""
        return [(fqn, HTTPRoute.model_validate(spec)) for fqn, spec in self.http_route_specs]

    def backends(self) -> list[tuple[str, Backend]]:
        return [(fqn, Backend.model_validate(spec)) for fqn, spec in self.backend_specs]

    def claim_limits(self) -> ClaimLimits:
        """Which claims each ext_authz policy publishes for the cluster's claim
        limits, and where such limits cannot work (shown in the status).

        Objects the models refuse are left out here: they already fail the
        artifacts they compile into, and must not fail the extauthz snapshot.
        """
        return compile_claim_limits(
            _parsed(BackendTrafficPolicy, self.traffic_specs),
            self.ext_authz_routes,
            (route for _, route in _parsed(HTTPRoute, self.http_route_specs)),
        )


_M = TypeVar("_M", BackendTrafficPolicy, HTTPRoute)


def _parsed(
    model: type[_M], specs: tuple[tuple[str, Mapping[str, Any]], ...]
) -> list[tuple[str, _M]]:
    """(fqn, object) for each stored spec the model accepts."""
    out = []
    for fqn, spec in specs:
        try:
            out.append((fqn, model.model_validate(spec)))
        except ValueError:
            continue
    return out


def _manifests(
    conn: Connection, cluster_fqn: str, kind: str
) -> tuple[tuple[str, dict[str, Any]], ...]:
    """The cluster's objects of a manifest kind (``{apiVersion, kind, metadata, spec}``)."""
    keys = ("apiVersion", "kind", "metadata", "spec")
    return tuple(
        (res.fqn, {k: res.spec[k] for k in keys if k in res.spec})
        for res in repo.all_children(conn, cluster_fqn, kind)
    )


@dataclass(frozen=True)
class _SecurityRead:
    """What the security groups reaching a cluster compile into."""

    policies: list[tuple[str, extauthz_compiler.StoredPolicy]] = field(default_factory=list)
    routes: list[envoy_config.ExtAuthzRoute] = field(default_factory=list)
    mesh: list[mesh_authz.MeshSetting] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _ext_authz_route(
    conn: Connection,
    setting: repo.Resource,
    authorization: AuthorizationSettings,
    namespaces: tuple[str, ...],
    notes: list[str],
) -> envoy_config.ExtAuthzRoute | None:
    """The gateways' entry for one setting; None when it checks nothing at the HTTP level."""
    group_fqn = setting.parent
    external = authorization.http.external if authorization.http else None
    disabled = authorization.mode == "DISABLED"
    # Mode DISABLED checks nothing, local rules included.
    local = None if disabled or not authorization.http else authorization.http.local
    if external is None and local is None and not disabled:
        return None
    if external is not None and local is not None:
        notes.append(
            f"{setting.fqn} has both local JWT rules and an external ext_authz "
            "server: the local rules apply and ext_authz is not called"
        )
    name = external.policy if external else None
    if name and not repo.exists(conn, f"{group_fqn}/extauthzpolicies/{name}"):
        notes.append(
            f"{setting.fqn} selects ExtAuthzPolicy {name!r}, which does not "
            "exist in its group: ext_authz denies its requests"
        )
    return envoy_config.ExtAuthzRoute(
        setting=setting.fqn,
        group=group_fqn,
        namespaces=namespaces,
        uri=external.uri if external else "",
        policy=extauthz_compiler.policy_name(group_fqn, name) if name else None,
        disabled=disabled,
        local=(
            None
            if local is None
            else local.model_dump(mode="json", by_alias=True, exclude_none=True)
        ),
        include_headers=tuple(
            (external.include_request_headers_in_check or ()) if external else ()
        ),
    )


def _security(conn: Connection, organization: str, cluster: str) -> _SecurityRead:
    out = _SecurityRead()
    for reach in groups_reaching(conn, organization, cluster):
        group = reach.group
        for policy in repo.all_children(conn, group.fqn, Kind.EXT_AUTHZ_POLICY):
            out.policies.append(
                (
                    extauthz_compiler.policy_name(group.fqn, policy.name),
                    # Stored by the API after ext_authz's loader accepted it.
                    cast(extauthz_compiler.StoredPolicy, policy.spec),
                )
            )
        namespaces = selected_namespaces(reach.selector, cluster)
        for setting in repo.all_children(conn, group.fqn, Kind.SECURITY_SETTING):
            # Stored through the same model by the API, so it reads back whole.
            authorization = (
                SecuritySetting.model_validate(setting.spec).authorization
                or AuthorizationSettings()
            )
            route = _ext_authz_route(conn, setting, authorization, namespaces, out.notes)
            if route is not None:
                out.routes.append(route)
            out.mesh.append(
                mesh_authz.MeshSetting(
                    setting=setting.fqn,
                    mode=authorization.mode,
                    namespaces=namespaces,
                    workspace_namespaces=selected_namespaces(reach.workspace_selector, cluster),
                    service_accounts=tuple(authorization.service_accounts or ()),
                    ext_authz=route,
                )
            )
    return out


def read_cluster(conn: Connection, organization: str, cluster: str) -> ClusterReadModel | None:
    """What ``organizations/{organization}/clusters/{cluster}`` must enforce; None if gone."""
    cluster_fqn = fqnmod.cluster_fqn(organization, cluster)
    res = repo.get(conn, cluster_fqn)
    if res is None:
        return None
    security = _security(conn, organization, cluster)
    return ClusterReadModel(
        organization=organization,
        cluster=cluster,
        cluster_fqn=cluster_fqn,
        traffic_specs=_manifests(conn, cluster_fqn, Kind.BACKEND_TRAFFIC_POLICY),
        extauthz_policies=tuple(security.policies),
        ext_authz_routes=tuple(security.routes),
        rate_limit=res.spec.get("rateLimit") or None,
        notes=tuple(security.notes),
        http_route_specs=_manifests(conn, cluster_fqn, Kind.HTTP_ROUTE),
        backend_specs=_manifests(conn, cluster_fqn, Kind.BACKEND),
        # The stored JSON as the API wrote it: parsed (defensively) on use.
        gateway_spec=cast(
            envoy_config.GatewayKnobs,
            {k: res.spec[k] for k in envoy_config.GATEWAY_SPEC_KEYS if k in res.spec},
        ),
        trust_domain=clusters.trust_domain(conn, res),
        mesh_settings=tuple(security.mesh),
        dangling=tuple(references.cluster_dangling(conn, cluster_fqn)),
    )


# ---- compiled artifacts ----------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """A service's snapshot for one cluster: file name → content. The version is its digest."""

    files: dict[str, bytes]

    @property
    def version(self) -> str:
        digest = hashlib.sha256()
        for name in sorted(self.files):
            digest.update(name.encode() + b"\0" + self.files[name] + b"\0")
        return digest.hexdigest()[:20]


def ratelimit_snapshot(policies: ClusterReadModel) -> Snapshot:
    """envoyproxy/ratelimit YAML, one file per policy, plus the cluster's switches.

    Only references travel in the switches (``urlRef``); a ``url`` cannot
    carry a password (the API refuses it), so no secret is ever in a snapshot.
    """
    files = render_rls_files(policies.cluster, [p for _, p in policies.traffic_policies()])
    # The gateway filter's timeout is Envoy's, not the service's: changing it
    # must not roll every ratelimit instance of the cluster.
    service_switches = {k: v for k, v in (policies.rate_limit or {}).items() if k != "timeout"}
    if service_switches:
        switches = {"rateLimit": service_switches}
        files[ratelimit_contract.SWITCHES_FILE] = json.dumps(switches, sort_keys=True).encode()
    ratelimit_contract.parse_config(files)
    return Snapshot(files)


def extauthz_snapshot(policies: ClusterReadModel) -> Snapshot:
    """The one ext_authz file: ``defaultPolicy: deny`` plus the policies that reach the cluster."""
    published = policies.claim_limits().published
    content = extauthz_compiler.render_file(list(policies.extauthz_policies), published)
    extauthz_contract.parse_config(content)
    return Snapshot({extauthz_contract.FILE_NAME: content})


SNAPSHOTS = {RATELIMIT: ratelimit_snapshot, EXTAUTHZ: extauthz_snapshot}

#: Which instances carry a policy of each kind: the artifacts its content compiles
#: into (the service's snapshot first, then the gateway's Envoy config: a
#: BackendTrafficPolicy's rate limits are both the ratelimit service's
#: descriptors and the gateway routes' ``rate_limits``; a security group's
#: settings and policies are both the ext_authz file and the routes' ext_authz
#: settings). The status views list exactly these kinds' instances, so "applied
#: everywhere" counts every instance that must ACK the policy. A setting also
#: reaches the sidecars (its mode, local rules and ext_authz are theirs), where
#: this replica serves them (:meth:`EnforcementService.reach`).
POLICY_REACH: Mapping[Kind, tuple[str, ...]] = {
    Kind.BACKEND_TRAFFIC_POLICY: (RATELIMIT, GATEWAY_KIND),
    Kind.SECURITY_SETTING: (EXTAUTHZ, GATEWAY_KIND, SIDECAR_KIND),
    Kind.EXT_AUTHZ_POLICY: (EXTAUTHZ, GATEWAY_KIND),
}


class UnknownCluster(LookupError):
    """The cluster a snapshot was asked for does not exist (any more)."""


class EnforcementService:
    """Compiles what clusters must enforce; every reader of the read model goes through it."""

    def __init__(self, uow: UnitOfWork, sidecars: SidecarDirectory | None = None) -> None:
        self.uow = uow
        self.sidecars = sidecars
        # kind → (organization, cluster) → the version its instances should run.
        self._versions: dict[str, Callable[[str, str], str]] = {
            **{kind: functools.partial(self._snapshot_version, kind) for kind in SNAPSHOTS},
            GATEWAY_KIND: self._gateway_version,
        }
        if sidecars is not None:  # sidecars are served where the ADS server runs
            self._versions[SIDECAR_KIND] = self._sidecar_version

    @property
    def kinds(self) -> tuple[str, ...]:
        """Who receives what this read model compiles: the services, then the gateways."""
        return tuple(self._versions)

    def reach(self, kind: Kind) -> tuple[str, ...]:
        """:data:`POLICY_REACH` of ``kind``, of the instance kinds this read model serves."""
        return tuple(k for k in POLICY_REACH[kind] if k in self._versions)

    def desired_version(self, kind: str, organization: str, cluster: str) -> str:
        """The version ``kind``'s instances of the cluster should run; raises when the
        cluster's objects do not compile (the status shows why)."""
        return self._versions[kind](organization, cluster)

    def _snapshot_version(self, kind: str, organization: str, cluster: str) -> str:
        return self.snapshot(kind, organization, cluster).version

    def _gateway_version(self, organization: str, cluster: str) -> str:
        # Compiled too (for a default gateway), so what would fail every
        # gateway's stream raises here as well.
        inp = self.gateway(organization, cluster)
        gateway_xds.compile_gateway(inp, GatewayNode(organization, cluster, "status"))
        return inp.version()

    def snapshot(self, kind: str, organization: str, cluster: str) -> Snapshot:
        """The validated snapshot a ``kind`` instance (ratelimit, extauthz) of the cluster loads."""
        with self.uow.read() as conn:
            policies = read_cluster(conn, organization, cluster)
        if policies is None:
            raise UnknownCluster(fqnmod.cluster_fqn(organization, cluster))
        return SNAPSHOTS[kind](policies)

    async def snapshot_async(self, kind: str, organization: str, cluster: str) -> Snapshot:
        """:meth:`snapshot` in a worker thread, for the event loop that also serves REST."""
        return await asyncio.to_thread(self.snapshot, kind, organization, cluster)

    def gateway(self, organization: str, cluster: str) -> gateway_xds.GatewayInput:
        """What the cluster's gateway Envoys are configured from (ADS)."""
        with self.uow.read() as conn:
            policies = read_cluster(conn, organization, cluster)
        if policies is None:
            raise UnknownCluster(fqnmod.cluster_fqn(organization, cluster))
        return gateway_xds.GatewayInput(
            gateway_input(policies, envoy_config.DEFAULT_RATELIMIT_SERVICE),
            tuple(policies.http_routes()),
            tuple(policies.backends()),
        )

    def _sidecar_version(self, organization: str, cluster: str) -> str:
        return self.sidecar(organization, cluster).version()

    def sidecar(self, organization: str, cluster: str) -> sidecar_xds.SidecarInput:
        """What the cluster's sidecar Envoys are configured from (ADS)."""
        with self.uow.read() as conn:
            policies = read_cluster(conn, organization, cluster)
        if policies is None:
            raise UnknownCluster(fqnmod.cluster_fqn(organization, cluster))
        endpoints = self.sidecars.endpoints(organization, cluster) if self.sidecars else ()
        return sidecar_xds.SidecarInput(
            cluster,
            endpoints,
            trust_domain=policies.trust_domain,
            settings=policies.mesh_settings,
            knobs=policies.gateway(),
        )

    async def sidecar_async(self, organization: str, cluster: str) -> sidecar_xds.SidecarInput:
        return await asyncio.to_thread(self.sidecar, organization, cluster)

    async def gateway_async(self, organization: str, cluster: str) -> gateway_xds.GatewayInput:
        return await asyncio.to_thread(self.gateway, organization, cluster)

    def envoy_config(
        self, ctx: CallContext, organization: str, cluster: str, ratelimit_service: str
    ) -> dict[str, Any]:
        """The gateway's Envoy config for the cluster (needs READ on the cluster).

        For people to read, so key material shows as its marker; gateways get
        theirs unredacted over ADS (:mod:`mgmt_api.compiler.gateway_xds`)."""
        check_grpc_uri("rateLimitService", ratelimit_service)
        cluster_fqn = fqnmod.cluster_fqn(organization, cluster)
        with self.uow.read() as conn:
            access.require(conn, ctx.principal, cluster_fqn, Kind.CLUSTER, rbac.READ)
            policies = read_cluster(conn, organization, cluster)
        if policies is None:
            raise not_found(cluster_fqn)
        document = envoy_config.render(gateway_input(policies, ratelimit_service))
        redacted: dict[str, Any] = key_material.redact_envoy_config(document)
        return redacted

    def policy_errors(self, organization: str, cluster: str) -> list[ClaimLimitErrorJson]:
        """What compiles but cannot be enforced as written (claim limits on a route
        no ext_authz checks), for the cluster's status."""
        with self.uow.read() as conn:
            policies = read_cluster(conn, organization, cluster)
        if policies is None:
            raise UnknownCluster(fqnmod.cluster_fqn(organization, cluster))
        return [error.to_json() for error in policies.claim_limits().errors]

    def dangling(self, organization: str, cluster: str) -> list[DanglingReference]:
        """The cluster's references to objects it does not have, for its status."""
        with self.uow.read() as conn:
            return references.cluster_dangling(conn, fqnmod.cluster_fqn(organization, cluster))

    def clusters_reached(self, organization: str, group_fqn: str) -> list[str]:
        """The existing clusters (names) a security group's selector reaches."""
        org_fqn = fqnmod.organization_fqn(organization)
        with self.uow.read() as conn:
            group = repo.get(conn, group_fqn)
            if group is None:
                raise not_found(group_fqn)
            names = selected_clusters(group_selector(conn, group))
            if names == ("*",):
                return [c.name for c in repo.all_children(conn, org_fqn, Kind.CLUSTER)]
            return [n for n in names if repo.exists(conn, fqnmod.cluster_fqn(organization, n))]


def gateway_input(
    policies: ClusterReadModel, ratelimit_service: str
) -> envoy_config.EnvoyConfigInput:
    """The renderer's input for the read model (one place maps one to the other)."""
    return envoy_config.EnvoyConfigInput(
        cluster_fqn=policies.cluster_fqn,
        cluster=policies.cluster,
        traffic_policies=tuple(policies.traffic_policies()),
        ext_authz=policies.ext_authz_routes,
        ratelimit_service=ratelimit_service,
        notes=policies.notes + tuple(d.message for d in policies.dangling),
        gateway=policies.gateway(),
        extauthz_policies=tuple(
            (name, cast(Mapping[str, Any], spec)) for name, spec in policies.extauthz_policies
        ),
        published_claims=policies.claim_limits().published,
    )
