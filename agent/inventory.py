"""The cluster's inventory report, built from what discovery found (pure).

The report has the shape of ``PUT .../clusters/{cluster}/inventory``
(``mgmt_api.schemas.inventory.InventoryReport``): namespaces, their
services, each service's workloads (proxy instances), and the cluster
state. The agent sends it over the tunnel whenever it changes, and at
least every ``--inventory-interval`` as a heartbeat.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.discovery import Proxy


@dataclass(frozen=True)
class NamespaceInfo:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    onboarded: bool | None = None


@dataclass(frozen=True)
class ServiceInfo:
    namespace: str
    name: str
    selector: Mapping[str, str] = field(default_factory=dict)
    ports: tuple[tuple[int, str], ...] = ()
    cluster_ip: str | None = None


def build_report(
    proxies: Iterable[Proxy],
    *,
    provider: str,
    agent_version: str,
    namespaces: Iterable[NamespaceInfo] = (),
    services: Iterable[ServiceInfo] = (),
    kubernetes_version: str | None = None,
) -> dict[str, Any]:
    """One report. Without a service list (static discovery) each workload is a service.

    A namespace with a proxy is reported as onboarded unless its own
    information says otherwise: a proxy there means the mesh runs in it.
    """
    by_workload: dict[tuple[str, str], list[Proxy]] = {}
    for proxy in proxies:
        by_workload.setdefault((proxy.namespace, proxy.workload), []).append(proxy)
    ns_info = {n.name: n for n in namespaces}
    service_list = list(services)
    if not service_list:
        service_list = [ServiceInfo(ns, wl) for ns, wl in by_workload]
    names = sorted({*ns_info, *(s.namespace for s in service_list), *(p[0] for p in by_workload)})
    out: list[dict[str, Any]] = []
    for ns in names:
        info = ns_info.get(ns, NamespaceInfo(ns))
        has_proxy = any(key[0] == ns for key in by_workload)
        entry: dict[str, Any] = {"name": ns}
        if info.labels:
            entry["labels"] = dict(sorted(info.labels.items()))
        onboarded = info.onboarded if info.onboarded is not None else (has_proxy or None)
        if onboarded is not None:
            entry["onboarded"] = onboarded
        svcs = []
        for svc in sorted((s for s in service_list if s.namespace == ns), key=lambda s: s.name):
            item: dict[str, Any] = {"name": svc.name}
            if svc.selector:
                item["selector"] = dict(sorted(svc.selector.items()))
            if svc.ports:
                item["ports"] = [
                    {"number": n, "name": p} if p else {"number": n} for n, p in svc.ports
                ]
            if svc.cluster_ip:
                item["kubernetesServiceIp"] = svc.cluster_ip
            instances = by_workload.get((ns, svc.name), [])
            if instances:
                item["workloads"] = [
                    {"name": p.instance, **({"address": p.pod_ip} if p.pod_ip else {})}
                    for p in sorted(instances, key=lambda p: p.instance)
                ]
            svcs.append(item)
        if svcs:
            entry["services"] = svcs
        out.append(entry)
    state: dict[str, Any] = {"provider": provider, "agentVersion": agent_version}
    if kubernetes_version:
        state["kubernetesVersion"] = kubernetes_version
    return {"namespaces": out, "state": state}
