"""The demo's mesh half: two workloads, each behind a sidecar Envoy, in two namespaces.

``scripts/run`` starts, for each :data:`WORKLOADS` entry, the demo app
(:mod:`mgmt_api.demo.upstream` with ``--name``) on its own loopback port and a
sidecar Envoy booted from :func:`meshplane.sidecar_contract.bootstrap`, which
takes its listeners, routes and endpoints from mgmt-api's ADS like the
gateway does. The tour then plays the app: it sends a request to a
workload's *outbound* listener with the callee's service name as ``Host``
(``payments.billing``), which is what the app's own HTTP client would do.

Pure: ports, nodes and bootstrap documents; the processes are started by
:class:`mgmt_api.demo.stack.Stack`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from meshplane import sidecar_contract as sc


class MeshPorts(Protocol):
    """The part of :class:`mgmt_api.demo.stack.Ports` a workload reads (the rest by name)."""

    @property
    def host(self) -> str: ...


@dataclass(frozen=True)
class DemoWorkload:
    """One demo workload: its identity and the prefix of its four ports' field names."""

    name: str
    namespace: str
    service_account: str

    @property
    def instance(self) -> str:
        """The sidecar's node id, as the cluster status lists it."""
        return f"{self.namespace}-{self.name}"

    @property
    def host(self) -> str:
        """The name other workloads call it by (``SERVICE.NAMESPACE``)."""
        return f"{self.name}.{self.namespace}"

    def port(self, ports: object, role: str) -> int:
        """``role`` is ``app``, ``inbound``, ``outbound`` or ``admin``."""
        value = getattr(ports, f"{self.name}_{role}")
        assert isinstance(value, int)
        return value


#: The workloads of the tour: a caller in ``shop`` and a callee in ``billing``.
WORKLOADS = (
    DemoWorkload("web", "shop", "web"),
    DemoWorkload("payments", "billing", "payments"),
)

#: The four ports of each workload: (field suffix, what it is for).
WORKLOAD_PORTS = (
    ("app", "the app on loopback"),
    ("inbound", "its sidecar's inbound listener (mTLS from other sidecars)"),
    ("outbound", "its sidecar's outbound listener (the app's calls)"),
    ("admin", "its sidecar's Envoy admin"),
)


def sidecar_node(
    organization: str, cluster: str, ports: MeshPorts, w: DemoWorkload
) -> sc.SidecarNode:
    """The sidecar's node: identity, app port and listeners, all on the demo's host."""
    return sc.SidecarNode(
        organization,
        cluster,
        w.instance,
        w.namespace,
        w.service_account,
        w.name,
        w.port(ports, "app"),
        inbound_host=ports.host,
        inbound_port=w.port(ports, "inbound"),
        outbound_port=w.port(ports, "outbound"),
    )
