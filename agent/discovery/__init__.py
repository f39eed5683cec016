"""Where the cluster's proxies are: the ``ProxySource`` seam and what it yields.

Two implementations: :mod:`agent.discovery.static` (a file of entries, for
VMs and tests) and :mod:`agent.discovery.kubernetes` (pods selected by
label, with in-cluster credentials). A source lists proxies, reports the
cluster's inventory, and streams one proxy's logs (from its log file, or
from the pod log API), so the rest of the agent never asks where a proxy
runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Proxy:
    """One Envoy: who it is, and how to reach its admin API and its logs."""

    namespace: str
    workload: str
    instance: str
    admin_address: str  # HOST:PORT of the admin listener
    log_file: str | None = None  # a file source's log
    pod_ip: str | None = None
    container: str | None = None  # the pod log API's container
    #: A sidecar: ``admin_address`` is its mTLS diagnostics port, reached with the
    #: agent's mesh certificate (:mod:`agent.mesh_identity`), not a plain admin port.
    mtls: bool = False

    @property
    def name(self) -> str:
        return f"{self.namespace}/{self.workload}/{self.instance}"


@dataclass(frozen=True)
class LogRequest:
    follow: bool
    tail_lines: int | None
    since_seconds: int | None


@dataclass(frozen=True)
class LogEntry:
    line: str
    time: float | None  # seconds since the epoch, when the line carries one


class LogsUnavailable(Exception):
    """The proxy's logs cannot be read (no log file configured, API refused)."""


class ProxySource(Protocol):
    kind: str  # "static" or "kubernetes": the inventory's state.provider

    async def proxies(self) -> list[Proxy]:
        """Every proxy the source knows now."""
        ...

    async def inventory(self) -> dict[str, Any]:
        """The cluster's InventoryReport (JSON body of PUT .../inventory)."""
        ...

    def logs(self, proxy: Proxy, request: LogRequest) -> AsyncIterator[LogEntry]:
        """The proxy's log lines; follows until cancelled when ``request.follow``."""
        ...

    async def close(self) -> None: ...


def select(proxies: list[Proxy], namespace: str, workload: str, instance: str) -> list[Proxy]:
    """The workload's proxies (one if ``instance`` is given), in instance order."""
    chosen = [
        p
        for p in proxies
        if p.namespace == namespace
        and p.workload == workload
        and (not instance or p.instance == instance)
    ]
    return sorted(chosen, key=lambda p: p.instance)
