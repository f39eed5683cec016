"""Kubernetes discovery: pods by label selector, and their logs from the pod log API.

In-cluster credentials, as every controller uses them: the API server from
``KUBERNETES_SERVICE_HOST``/``_PORT``, the service-account token (read again
on every request: projected tokens rotate) and ``ca.crt`` from
``/var/run/secrets/kubernetes.io/serviceaccount``. The agent needs
``list`` on pods, services and namespaces and ``get`` on ``pods/log``
(the ``meshplane-cluster`` Helm chart's ClusterRole, ``deploy/helm/``), and
the service-account issuer discovery endpoints
(``system:service-account-issuer-discovery``).

The inventory lists every pod of the watched namespaces (name, uid, IP,
service account, and the services whose selector matches its labels) and
the cluster's service-account issuer: ``GET /.well-known/openid-configuration``
for the issuer URL and its ``jwks_uri``, whose path is then read from the
API server itself (the URL may name an address only the outside reaches).
mgmt-api verifies the pods' projected tokens against both (docs/mesh.md).
The issuer is read again every :data:`ISSUER_TTL_SECONDS`; when it cannot
be read the report goes without it (and says so in the log).

A pod is a proxy when it matches ``--selector``, runs and has an IP; its
workload is the first of ``--workload-label`` it carries (else the pod
name), its admin API ``podIP:--admin-port``. That port must be reachable
from the agent's pod: proxies whose admin listener is bound to localhost
only (Istio's default) are listed but answer UNAVAILABLE.

Listings are cached for :data:`LIST_TTL_SECONDS`, so a burst of
diagnostics costs one list, not one per call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from agent.contract import MAX_JWKS_BYTES, StatusCode
from agent.discovery import LogEntry, LogRequest, LogsUnavailable, Proxy
from agent.envoy_admin import AdminCallError
from agent.inventory import NamespaceInfo, PodInfo, ServiceInfo, build_report
from agent.logs import DEFAULT_TAIL_LINES
from agent.logtail import LineSplitter, rfc3339_seconds
from meshplane.config_error import ConfigError

log = logging.getLogger(__name__)

CREDENTIALS_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_SELECTOR = "security.istio.io/tlsMode=istio"
DEFAULT_WORKLOAD_LABELS = ("service.istio.io/canonical-name", "app.kubernetes.io/name", "app")
LIST_TTL_SECONDS = 2.0
#: How long the issuer's discovery document and keys are reused.
ISSUER_TTL_SECONDS = 300.0
#: Pod phases that no longer run a workload.
_ENDED = ("Succeeded", "Failed")
TIMEOUT = httpx.Timeout(10.0, read=None)  # log streams wait for lines as long as they follow


@dataclass(frozen=True)
class KubernetesConfig:
    api_url: str
    token_file: Path
    ca_file: Path | None
    selector: str
    namespaces: tuple[str, ...]
    admin_port: int
    container: str
    workload_labels: tuple[str, ...]
    #: The pods are sidecars reached on their mTLS diagnostics port (``admin_port``).
    mtls: bool = False


class KubernetesSource:
    """A :class:`~agent.discovery.ProxySource` over the Kubernetes API."""

    kind = "kubernetes"

    def __init__(self, config: KubernetesConfig, agent_version: str) -> None:
        self.config = config
        self.agent_version = agent_version
        verify: Any = str(config.ca_file) if config.ca_file else True
        self._http = httpx.AsyncClient(
            base_url=config.api_url, verify=verify, timeout=TIMEOUT, trust_env=False
        )
        self._cached: tuple[float, list[Proxy]] | None = None
        self._issuer: tuple[float, dict[str, Any]] | None = None
        self._lock = asyncio.Lock()

    @classmethod
    def in_cluster(
        cls,
        *,
        selector: str,
        namespaces: tuple[str, ...],
        admin_port: int,
        container: str,
        workload_labels: tuple[str, ...],
        api_url: str | None,
        credentials_dir: Path | None,
        agent_version: str,
        mtls: bool = False,
    ) -> KubernetesSource:
        directory = credentials_dir or CREDENTIALS_DIR
        if api_url is None:
            host = os.environ.get("KUBERNETES_SERVICE_HOST")
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            if not host:
                raise ConfigError(
                    "not in a Kubernetes pod (no KUBERNETES_SERVICE_HOST); give --kube-api",
                    field="--kubernetes",
                )
            api_url = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        token = directory / "token"
        if not token.is_file():
            raise ConfigError(f"no service-account token at {token}", field="--kubernetes")
        ca = directory / "ca.crt"
        config = KubernetesConfig(
            api_url=api_url.rstrip("/"),
            token_file=token,
            ca_file=ca if ca.is_file() else None,
            selector=selector,
            namespaces=namespaces,
            admin_port=admin_port,
            container=container,
            workload_labels=workload_labels,
            mtls=mtls,
        )
        return cls(config, agent_version)

    def _headers(self) -> dict[str, str]:
        token = self.config.token_file.read_text().strip()
        return {"Authorization": f"Bearer {token}", "Accept": "application/json"}

    async def _get(self, path: str, params: dict[str, str] | None = None) -> Any:
        try:
            response = await self._http.get(path, params=params, headers=self._headers())
        except httpx.TransportError as exc:
            raise AdminCallError(
                StatusCode.UNAVAILABLE, f"the Kubernetes API is unreachable: {exc}"
            ) from None
        if response.status_code != 200:
            raise AdminCallError(
                StatusCode.UNAVAILABLE,
                f"the Kubernetes API answered {path} with {response.status_code}: "
                f"{response.text[:200]}",
            )
        return response.json()

    async def _list(self, resource: str, params: dict[str, str] | None = None) -> list[Any]:
        if not self.config.namespaces:
            items: list[Any] = (await self._get(f"/api/v1/{resource}", params))["items"]
            return items
        out: list[Any] = []
        for ns in self.config.namespaces:
            out += (await self._get(f"/api/v1/namespaces/{ns}/{resource}", params))["items"]
        return out

    def _proxy(self, pod: dict[str, Any]) -> Proxy | None:
        meta, status = pod.get("metadata", {}), pod.get("status", {})
        ip = status.get("podIP")
        if status.get("phase") != "Running" or not ip:
            return None
        labels = meta.get("labels") or {}
        workload = next(
            (labels[k] for k in self.config.workload_labels if labels.get(k)), meta["name"]
        )
        host = f"[{ip}]" if ":" in ip else ip
        return Proxy(
            namespace=meta["namespace"],
            workload=workload,
            instance=meta["name"],
            admin_address=f"{host}:{self.config.admin_port}",
            pod_ip=ip,
            container=self.config.container,
            mtls=self.config.mtls,
        )

    async def proxies(self) -> list[Proxy]:
        async with self._lock:
            now = time.monotonic()
            if self._cached is not None and now - self._cached[0] < LIST_TTL_SECONDS:
                return self._cached[1]
            pods = await self._list("pods", {"labelSelector": self.config.selector})
            found = [p for p in (self._proxy(pod) for pod in pods) if p is not None]
            self._cached = (now, found)
            return found

    async def inventory(self) -> dict[str, Any]:
        proxies = await self.proxies()
        namespaces = [
            NamespaceInfo(ns["metadata"]["name"], ns["metadata"].get("labels") or {})
            for ns in (await self._get("/api/v1/namespaces"))["items"]
            if not self.config.namespaces or ns["metadata"]["name"] in self.config.namespaces
        ]
        services = [
            ServiceInfo(
                namespace=svc["metadata"]["namespace"],
                name=svc["metadata"]["name"],
                selector=svc.get("spec", {}).get("selector") or {},
                ports=tuple(
                    (int(p["port"]), str(p.get("name") or ""))
                    for p in svc.get("spec", {}).get("ports") or []
                ),
                cluster_ip=(svc.get("spec", {}).get("clusterIP") or None),
            )
            for svc in await self._list("services")
        ]
        version = None
        with contextlib.suppress(AdminCallError, KeyError, TypeError):
            version = (await self._get("/version"))["gitVersion"]
        pods = [p for p in (_pod(item) for item in await self._list("pods")) if p is not None]
        return build_report(
            proxies,
            provider="kubernetes",
            agent_version=self.agent_version,
            namespaces=namespaces,
            services=services,
            kubernetes_version=version,
            pods=pods,
            issuer=await self.issuer(),
        )

    async def issuer(self) -> dict[str, Any] | None:
        """``{issuer, jwks}`` of the cluster's service-account issuer (cached), or None."""
        now = time.monotonic()
        if self._issuer is not None and now - self._issuer[0] < ISSUER_TTL_SECONDS:
            return self._issuer[1]
        try:
            discovery = await self._get("/.well-known/openid-configuration")
            jwks_path = urlsplit(str(discovery["jwks_uri"])).path
            jwks = await self._get(jwks_path)
            found = {"issuer": str(discovery["issuer"]), "jwks": {"keys": list(jwks["keys"])}}
        except (AdminCallError, KeyError, TypeError, ValueError) as exc:
            log.warning(
                "cannot read the service-account issuer: workload tokens of this cluster "
                "verify only against issuers registered on the cluster",
                extra={"error": str(exc)[:300]},
            )
            return self._issuer[1] if self._issuer is not None else None
        if len(json.dumps(found["jwks"])) > MAX_JWKS_BYTES:
            log.warning("the service-account issuer's JWKS is too large to report")
            return None
        self._issuer = (now, found)
        return found

    async def logs(self, proxy: Proxy, request: LogRequest) -> AsyncIterator[LogEntry]:
        params = {"timestamps": "true", "follow": "true" if request.follow else "false"}
        if proxy.container:
            params["container"] = proxy.container
        tail = request.tail_lines
        if tail is None and request.since_seconds is None:
            tail = DEFAULT_TAIL_LINES
        if tail is not None:
            params["tailLines"] = str(tail)
        if request.since_seconds is not None:
            params["sinceSeconds"] = str(request.since_seconds)
        path = f"/api/v1/namespaces/{proxy.namespace}/pods/{proxy.instance}/log"
        try:
            async with self._http.stream(
                "GET", path, params=params, headers=self._headers()
            ) as response:
                if response.status_code != 200:
                    body = (await response.aread())[:300].decode("utf-8", errors="replace")
                    raise LogsUnavailable(
                        f"the pod log API answered {response.status_code} for {proxy.name}: {body}"
                    )
                splitter = LineSplitter()
                async for chunk in response.aiter_raw():
                    for line in splitter.feed(chunk):
                        yield _entry(line)
                for line in splitter.flush():
                    yield _entry(line)
        except httpx.TransportError as exc:
            raise LogsUnavailable(f"the pod log API failed for {proxy.name}: {exc}") from None

    async def close(self) -> None:
        await self._http.aclose()


def _pod(item: dict[str, Any]) -> PodInfo | None:
    """A pod of the inventory; None once it ended (or without a uid)."""
    meta, spec, status = item.get("metadata", {}), item.get("spec", {}), item.get("status", {})
    if status.get("phase") in _ENDED or not meta.get("uid") or not meta.get("name"):
        return None
    return PodInfo(
        namespace=str(meta.get("namespace", "")),
        name=str(meta["name"]),
        uid=str(meta["uid"]),
        ip=status.get("podIP") or None,
        service_account=spec.get("serviceAccountName") or None,
        labels=meta.get("labels") or {},
    )


def _entry(line: str) -> LogEntry:
    """``timestamps=true`` lines: ``<RFC 3339 time> <line>``."""
    stamp, sep, rest = line.partition(" ")
    seconds = rfc3339_seconds(stamp) if sep else None
    return LogEntry(rest, seconds) if seconds is not None else LogEntry(line, None)
