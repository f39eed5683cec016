"""What a cluster's agent reports (``PUT .../clusters/{cluster}/inventory``).

Shapes follow the reference's Namespace, ClusterService, Workload and
ClusterState records. Every list and string is bounded, so a report is
rejected (400 naming the field) before it can replace the last good one;
the API-wide request body limit bounds the whole report.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from agent.contract import MAX_POD_SERVICES, MAX_PODS_PER_NAMESPACE
from mgmt_api.schemas.base import ApiModel

MAX_NAMESPACES = 2000
MAX_SERVICES = 1000  # per namespace
MAX_WORKLOADS = 1000  # per service
MAX_ITEMS = 100  # ports, addresses, versions, ...
MAX_MAP = 64  # labels, annotations, selectors
MAX_PODS = MAX_PODS_PER_NAMESPACE

Map = dict[str, str]


class ServicePort(ApiModel):
    number: int = Field(ge=1, le=65535)
    name: str | None = Field(default=None, max_length=63)
    kubernetes_node_port: int | None = Field(default=None, ge=0, le=65535)


class Proxy(ApiModel):
    control_plane_address: str | None = Field(default=None, max_length=256)
    envoy_version: str | None = Field(default=None, max_length=64)
    istio_version: str | None = Field(default=None, max_length=64)
    status: Map | None = Field(default=None, max_length=MAX_MAP)


class Workload(ApiModel):
    name: str = Field(max_length=253)
    address: str | None = Field(default=None, max_length=256)
    is_vm: bool | None = None
    proxy: Proxy | None = None


class ReportedService(ApiModel):
    name: str = Field(max_length=63, description="Kubernetes service name (DNS-1123 label).")
    hostname: str | None = Field(default=None, max_length=253)
    canonical_name: str | None = Field(default=None, max_length=253)
    selector: Map | None = Field(default=None, max_length=MAX_MAP)
    labels: Map | None = Field(default=None, max_length=MAX_MAP)
    annotations: Map | None = Field(default=None, max_length=MAX_MAP)
    ports: list[ServicePort] | None = Field(default=None, max_length=MAX_ITEMS)
    subsets: list[str] | None = Field(default=None, max_length=MAX_ITEMS)
    kubernetes_service_ip: str | None = Field(default=None, max_length=64)
    kubernetes_external_addresses: list[str] | None = Field(default=None, max_length=MAX_ITEMS)
    kubernetes_service_fqdn: str | None = Field(default=None, max_length=253)
    num_kubernetes_endpoints: int | None = Field(default=None, ge=0)
    num_vm_endpoints: int | None = Field(default=None, ge=0)
    num_hops: int | None = Field(default=None, ge=0)
    gateway_host: bool | None = None
    tier1_gateway_host: bool | None = None
    mesh_external: bool | None = None
    spiffe_ids: list[str] | None = Field(default=None, max_length=MAX_ITEMS)
    state: str | None = Field(
        default=None, max_length=32, description="EXTERNAL/OBSERVED/CONTROLLED"
    )
    workloads: list[Workload] | None = Field(default=None, max_length=MAX_WORKLOADS)


class ReportedPod(ApiModel):
    """A pod of the namespace: what workload attestation checks a workload token against."""

    name: str = Field(max_length=253)
    uid: str = Field(min_length=1, max_length=64)
    ip: str | None = Field(
        default=None, max_length=64, description="The pod IP (loopback in the static mode)."
    )
    service_account: str | None = Field(default=None, max_length=253)
    services: list[Annotated[str, Field(max_length=63)]] | None = Field(
        default=None,
        max_length=MAX_POD_SERVICES,
        description="Services of the namespace whose selector matches the pod.",
    )


class IstioSettings(ApiModel):
    istio_injection: str | None = Field(default=None, max_length=64)
    istio_revision: str | None = Field(default=None, max_length=64)


class ReportedNamespace(ApiModel):
    name: str = Field(max_length=63, description="DNS-1123 label.")
    labels: Map | None = Field(default=None, max_length=MAX_MAP)
    istio: IstioSettings | None = None
    onboarded: bool | None = Field(
        default=None,
        description=(
            "Whether the agent has onboarded the namespace (our addition). When absent, "
            "sidecar injection decides: istio.istioInjection (else the istio-injection "
            "label) 'enabled', or without it a revision (istio.istioRevision, else the "
            "istio.io/rev label). The onboarding status compares this with the desired state."
        ),
    )
    services: list[ReportedService] | None = Field(default=None, max_length=MAX_SERVICES)
    pods: list[ReportedPod] | None = Field(default=None, max_length=MAX_PODS)


class IstioRevision(ApiModel):
    distribution: str | None = Field(default=None, max_length=64)
    revision: str | None = Field(default=None, max_length=64)
    version: str | None = Field(default=None, max_length=64)


class ReportedLocality(ApiModel):
    region: str = Field(max_length=128)


class ReportedState(ApiModel):
    provider: str | None = Field(default=None, max_length=64, description="GKE, EKS, AKS, ...")
    istio_versions: list[str] | None = Field(default=None, max_length=MAX_ITEMS)
    istio_revisions: list[IstioRevision] | None = Field(default=None, max_length=MAX_ITEMS)
    xcp_version: str | None = Field(default=None, max_length=64)
    tsb_cp_version: str | None = Field(default=None, max_length=64)
    agent_version: str | None = Field(default=None, max_length=64)
    kubernetes_version: str | None = Field(default=None, max_length=64)
    discovered_locality: ReportedLocality | None = None
    mode: str | None = Field(default=None, max_length=32, description="CONTROL or OBSERVE")
    service_account_issuer: dict[str, Any] | None = Field(
        default=None,
        description=(
            'The cluster\'s service-account issuer: {"issuer": URL, "jwks": {"keys": '
            "[public JWKs]}} (at most 16 keys, 16 KiB). Workload tokens it signs verify."
        ),
    )


class InventoryReport(ApiModel):
    """The agent's full view of its cluster; each report replaces the previous one."""

    namespaces: list[ReportedNamespace] = Field(max_length=MAX_NAMESPACES)
    state: ReportedState


class ClusterStateView(ReportedState):
    last_sync_time: str = Field(description="When the management plane received the report.")
    stale: bool = Field(description="The agent has been silent longer than the threshold.")


class ServiceLookupSelector(ApiModel):
    names: list[str] = Field(
        min_length=1,
        max_length=100,
        description="cluster/namespace patterns: '*' for a segment, trailing '*' on the namespace.",
    )


class ServiceLookupRequest(ApiModel):
    parent: str = Field(max_length=512, description="An organization or an object in one.")
    selector: ServiceLookupSelector
    page_size: int = Field(
        default=100, ge=1, le=1000, description="Services per page (our addition); default 100."
    )
    page_token: str = Field(
        default="", max_length=2048, description="nextPageToken of the previous page."
    )


class RegisteredServicePort(ApiModel):
    number: int
    name: str | None = None


class RegisteredService(ApiModel):
    fqn: str = Field(description="{cluster}/namespaces/{ns}/services/{name}; agent data only.")
    cluster: str
    namespace: str
    short_name: str
    hostnames: list[str]
    ports: list[RegisteredServicePort]
    service_type: str = Field(description="INTERNAL, LOADBALANCER or MESH_EXTERNAL")
    external_addresses: list[str]
    state: str = Field(description="EXTERNAL, OBSERVED or CONTROLLED (default OBSERVED)")
    spiffe_ids: list[str]
    canonical_name: str | None = None


class ServiceLookupResponse(ApiModel):
    services: list[RegisteredService] = Field(
        description="Ordered by cluster FQN, namespace, service name."
    )
    next_page_token: str = Field(description="Empty on the last page.")
