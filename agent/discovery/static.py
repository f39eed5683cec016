"""Static discovery: a file of proxies, for VMs (and the tests).

The file (YAML or JSON) is a list of entries, or ``{proxies: [...]}``::

    - {namespace: shop, workload: web, instance: web-1,
       adminAddress: 10.0.0.7:15000, logFile: /var/log/envoy/envoy.log}

It is read again whenever its modification time changes, so an operator
edits it in place; an edit that does not validate keeps the last good list
(and is logged), as every meshplane config does.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agent import contract
from agent.discovery import LogEntry, LogRequest, LogsUnavailable, Proxy
from agent.inventory import build_report
from agent.logs import follow_file
from meshplane.config_error import ConfigError
from meshplane.netaddr import parse_listen
from meshplane.validate import Fields, Node
from meshplane.yamlconf import load_yaml

log = logging.getLogger(__name__)

_REQUIRED = ("namespace", "workload", "instance", "adminAddress")
_OPTIONAL = ("logFile",)


def parse_entries(document: Any, source: str) -> list[Proxy]:
    """Validate the file's document; ConfigError names the line, entry and field."""
    root = Node(document, source=source)
    if isinstance(document, dict) and set(document) == {"proxies"}:
        root = root.child("proxies")
    if root.value is None:
        return []
    proxies: list[Proxy] = []
    seen: set[tuple[str, str, str]] = set()
    for item in root.items(of="proxies (or {proxies: [...]})"):
        proxy = _proxy(item.fields(_REQUIRED, _OPTIONAL))
        key = (proxy.namespace, proxy.workload, proxy.instance)
        if key in seen:
            raise item.child("instance").error("listed twice")
        seen.add(key)
        proxies.append(proxy)
    return proxies


def _proxy(f: Fields) -> Proxy:
    values = {name: f.required(name).string() for name in _REQUIRED}
    log_file = f.present("logFile")
    try:
        contract.check_workload(values["namespace"], values["workload"], values["instance"])
    except contract.FieldError as exc:
        raise f.node.child(exc.field).error(exc.message) from None
    address = f.node.child("adminAddress")
    try:
        host, port = parse_listen(values["adminAddress"])
    except ValueError as exc:
        raise address.error(str(exc)) from None
    if port == 0 or host == "0.0.0.0":
        raise address.error("needs a host and a port")
    return Proxy(
        namespace=values["namespace"],
        workload=values["workload"],
        instance=values["instance"],
        admin_address=values["adminAddress"],
        log_file=log_file.string() if log_file is not None else None,
        pod_ip=host,
    )


def load(path: Path) -> list[Proxy]:
    return parse_entries(load_yaml(path), str(path))


class StaticSource:
    """A :class:`~agent.discovery.ProxySource` over a file, reloaded when it changes."""

    kind = "static"

    def __init__(self, path: Path, agent_version: str) -> None:
        self.path = path
        self.agent_version = agent_version
        self._mtime = os.stat(path).st_mtime_ns
        self._proxies = load(path)  # a bad file stops the start

    async def proxies(self) -> list[Proxy]:
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except OSError as exc:
            log.warning(
                "cannot stat the proxies file", extra={"path": str(self.path), "error": str(exc)}
            )
            return self._proxies
        if mtime != self._mtime:
            self._mtime = mtime
            try:
                self._proxies = await asyncio.to_thread(load, self.path)
                log.info("proxies file reloaded", extra={"proxies": len(self._proxies)})
            except ConfigError as exc:
                log.error(
                    "proxies file rejected; keeping the last good list", extra={"error": str(exc)}
                )
        return self._proxies

    async def inventory(self) -> dict[str, Any]:
        return build_report(
            await self.proxies(), provider="static", agent_version=self.agent_version
        )

    async def logs(self, proxy: Proxy, request: LogRequest) -> AsyncIterator[LogEntry]:
        if not proxy.log_file:
            raise LogsUnavailable(f"{proxy.name} has no logFile in {self.path}")
        async for entry in follow_file(proxy.log_file, request):
            yield entry

    async def close(self) -> None:
        return None
