"""The cluster's inventory report, built from what discovery found (pure).

The report has the shape of ``PUT .../clusters/{cluster}/inventory``
(``mgmt_api.schemas.inventory.InventoryReport``): namespaces, their
services, each service's workloads (proxy instances), their pods, and the
cluster state. The agent sends it over the tunnel whenever it changes, and
at least every ``--inventory-interval`` as a heartbeat.

The pods (name, uid, IP, service account, the services whose selector
matches them) and the state's ``serviceAccountIssuer`` are what mgmt-api
verifies workload tokens against (docs/mesh.md, "Attestation"): a pod
missing from a report no longer gets certificates or keeps its streams.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.contract import MAX_POD_SERVICES, MAX_PODS_PER_NAMESPACE
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


@dataclass(frozen=True)
class PodInfo:
    """A pod: ``services`` as given (static discovery), or None to match selectors."""

    namespace: str
    name: str
    uid: str
    ip: str | None = None
    service_account: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    services: tuple[str, ...] | None = None


def member_of(pod: PodInfo, services: Iterable[ServiceInfo]) -> list[str]:
    """The services of the pod's namespace whose (non-empty) selector its labels match,
    sorted; a pod's explicit ``services`` when it has them."""
    if pod.services is not None:
        return sorted(set(pod.services))
    return sorted(
        s.name
        for s in services
        if s.namespace == pod.namespace
        and s.selector
        and all(pod.labels.get(k) == v for k, v in s.selector.items())
    )


def _pod_entry(pod: PodInfo, services: list[ServiceInfo]) -> dict[str, Any]:
    item: dict[str, Any] = {"name": pod.name, "uid": pod.uid}
    if pod.ip:
        item["ip"] = pod.ip
    if pod.service_account:
        item["serviceAccount"] = pod.service_account
    member = member_of(pod, services)[:MAX_POD_SERVICES]
    if member:
        item["services"] = member
    return item


def build_report(
    proxies: Iterable[Proxy],
    *,
    provider: str,
    agent_version: str,
    namespaces: Iterable[NamespaceInfo] = (),
    services: Iterable[ServiceInfo] = (),
    kubernetes_version: str | None = None,
    pods: Iterable[PodInfo] = (),
    issuer: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One report. Without a service list (static discovery) each workload is a service.

    A namespace with a proxy is reported as onboarded unless its own
    information says otherwise: a proxy there means the mesh runs in it.
    ``issuer`` is the cluster's service-account issuer ``{issuer, jwks}``.
    """
    by_workload: dict[tuple[str, str], list[Proxy]] = {}
    for proxy in proxies:
        by_workload.setdefault((proxy.namespace, proxy.workload), []).append(proxy)
    ns_info = {n.name: n for n in namespaces}
    service_list = list(services)
    if not service_list:
        service_list = [ServiceInfo(ns, wl) for ns, wl in by_workload]
    pod_list = sorted(pods, key=lambda p: (p.namespace, p.name))
    names = sorted(
        {
            *ns_info,
            *(s.namespace for s in service_list),
            *(p[0] for p in by_workload),
            *(p.namespace for p in pod_list),
        }
    )
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
        ns_pods = [_pod_entry(p, service_list) for p in pod_list if p.namespace == ns]
        ns_pods = ns_pods[:MAX_PODS_PER_NAMESPACE]
        if ns_pods:
            entry["pods"] = ns_pods
        out.append(entry)
    state: dict[str, Any] = {"provider": provider, "agentVersion": agent_version}
    if kubernetes_version:
        state["kubernetesVersion"] = kubernetes_version
    if issuer is not None:
        state["serviceAccountIssuer"] = dict(issuer)
    return {"namespaces": out, "state": state}
