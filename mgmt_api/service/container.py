"""Every service of the management plane, built once per app from the settings.

Routes never construct a service (or open a transaction) themselves: they
receive the ones built here through ``Annotated`` dependencies
(:mod:`mgmt_api.routes.deps`). All share one :class:`UnitOfWork`, so every
write of every service bumps the same revision, is audited the same way and
wakes the same listeners.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.engine import Engine

from mgmt_api.domain.durations import parse_duration
from mgmt_api.domain.throttle import ThrottleRule
from mgmt_api.kinds import KindSettings
from mgmt_api.service.approvals import ApprovalService
from mgmt_api.service.audit import AuditService
from mgmt_api.service.authn import Authenticator
from mgmt_api.service.bootstrap import bootstrap
from mgmt_api.service.cleanup import CleanupService
from mgmt_api.service.clusters import ClusterService
from mgmt_api.service.enforcement import EnforcementService
from mgmt_api.service.instances import SubscriberRegistry
from mgmt_api.service.inventory import InventoryService
from mgmt_api.service.mesh_ca import MeshCaStore
from mgmt_api.service.onboarding import OnboardingService
from mgmt_api.service.policies import PolicyService
from mgmt_api.service.profiles import ProfileService
from mgmt_api.service.proxytools import ProxyTools
from mgmt_api.service.replicas import ReplicaPeers
from mgmt_api.service.resources import ResourceService
from mgmt_api.service.service_accounts import ServiceAccountService
from mgmt_api.service.sidecars import SidecarDirectory
from mgmt_api.service.status import StatusService
from mgmt_api.service.stream_auth import StreamAuth
from mgmt_api.service.tunnel_hub import TunnelHub
from mgmt_api.service.workload_trust import Attestation, WorkloadTrustStore
from mgmt_api.service.workloads import WorkloadService
from mgmt_api.settings import Settings
from mgmt_api.store.uow import UnitOfWork


@dataclass(frozen=True)
class Services:
    settings: Settings
    uow: UnitOfWork
    #: The server's signing secret (session tokens, console CSRF), shared by replicas.
    signing_secret: str
    kind_settings: KindSettings
    authn: Authenticator
    resources: ResourceService
    policies: PolicyService
    service_accounts: ServiceAccountService
    clusters: ClusterService
    approvals: ApprovalService
    cleanup: CleanupService
    inventory: InventoryService
    onboarding: OnboardingService
    profiles: ProfileService
    audit: AuditService
    enforcement: EnforcementService
    stream_auth: StreamAuth
    status: StatusService
    #: What each subscribed instance applied; None when distribution is off.
    registry: SubscriberRegistry | None
    #: Proxy diagnostics through the agents' tunnels (on the gRPC server); None when off.
    proxytools: ProxyTools | None
    #: Workload token verification (Sign, sidecar ADS) over the inventory's read model.
    attestation: Attestation
    #: The clusters' mesh CAs: the rotation REST starts and the status shows.
    mesh_ca: MeshCaStore
    #: Each cluster's sidecars, identities, certificates and callers (``.../workloads``).
    workloads: WorkloadService

    @classmethod
    def build(cls, engine: Engine, settings: Settings) -> Services:
        """Bootstrap the store (first start) and wire every service onto it."""
        uow = UnitOfWork(engine)
        secret = bootstrap(uow, settings.admin_password)
        kind_settings = KindSettings(
            onboarding_tenant=settings.onboarding_tenant,
            onboarding_workspace=settings.onboarding_workspace,
            stale_after_seconds=parse_duration(
                settings.agent_stale_after, "MESHPLANE_AGENT_STALE_AFTER"
            ),
            grpc_public_url=settings.grpc_public_url,
            grpc_listen=settings.grpc_listen,
            grpc_tls=settings.grpc_tls_cert is not None,
        )
        registry = proxytools = sidecars = None
        if settings.grpc_listen:
            stale_after = parse_duration(
                settings.distribution_stale_after, "MESHPLANE_DISTRIBUTION_STALE_AFTER"
            )
            registry = SubscriberRegistry(stale_after=stale_after)
            sidecars = SidecarDirectory(uow)
            timeout = parse_duration(settings.proxytools_timeout, "MESHPLANE_PROXYTOOLS_TIMEOUT")
            proxytools = ProxyTools(uow, TunnelHub(), timeout)
            if settings.replica_secret and settings.replica_address:
                proxytools.peers = _peers(uow, proxytools.hub, settings)
        enforcement = EnforcementService(uow, sidecars)
        trust = WorkloadTrustStore(uow)
        cas = MeshCaStore(uow)
        return cls(
            settings=settings,
            uow=uow,
            signing_secret=secret,
            kind_settings=kind_settings,
            authn=Authenticator(
                uow,
                secret,
                throttle=ThrottleRule.with_first_lockout(
                    parse_duration(settings.login_lockout, "MESHPLANE_LOGIN_LOCKOUT")
                ),
            ),
            resources=ResourceService(uow, kind_settings),
            policies=PolicyService(uow),
            service_accounts=ServiceAccountService(uow),
            clusters=ClusterService(uow),
            approvals=ApprovalService(uow),
            cleanup=CleanupService(uow, kind_settings),
            inventory=InventoryService(
                uow, kind_settings.stale_after_seconds, reported=trust.reported
            ),
            onboarding=OnboardingService(uow, kind_settings),
            profiles=ProfileService(uow),
            audit=AuditService(uow),
            enforcement=enforcement,
            stream_auth=StreamAuth(uow),
            status=StatusService(uow, enforcement, registry, cas),
            registry=registry,
            proxytools=proxytools,
            attestation=Attestation(uow, trust),
            mesh_ca=cas,
            workloads=WorkloadService(uow, enforcement, registry, cas),
        )


def _peers(uow: UnitOfWork, hub: TunnelHub, settings: Settings) -> ReplicaPeers:
    """The replica registry and forwarding, wired to the hub both ways."""
    assert settings.replica_secret is not None and settings.replica_address is not None
    peers = ReplicaPeers(
        uow,
        secret=settings.replica_secret.encode(),
        address=settings.replica_address,
        clusters=hub.clusters,
        ca_file=settings.replica_ca,
    )
    hub.forward = peers.forward
    hub.on_change = peers.tunnels_changed
    return peers
