"""Static discovery: a file of proxies, for VMs (and the tests).

The file (YAML or JSON) is a list of entries, or ``{proxies: [...]}``::

    - {namespace: shop, workload: web, instance: web-1,
       adminAddress: 10.0.0.7:15000, logFile: /var/log/envoy/envoy.log}
    - {namespace: shop, workload: api, instance: api-1,
       diagnosticsAddress: 10.0.0.8:15021}

``adminAddress`` is a plain admin port (a gateway's); ``diagnosticsAddress``
a sidecar's mTLS diagnostics port, reached with the agent's mesh
certificate (:mod:`agent.mesh_identity`).

or, with the pods whose workload tokens mgmt-api may verify (docs/mesh.md,
"Attestation"), ``{proxies: [...], pods: [...]}``::

    pods:
      - {namespace: shop, name: web-1, uid: 6f1c..., serviceAccount: web,
         ip: 127.0.0.1, services: [web]}

A pod's ``ip`` is where its sidecar accepts calls (loopback when everything
runs on one host); ``services`` the services it may register as an endpoint of.

It is read again whenever its modification time changes, so an operator
edits it in place; an edit that does not validate keeps the last good list
(and is logged), as every meshplane config does.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent import contract
from agent.discovery import LogEntry, LogRequest, LogsUnavailable, Proxy
from agent.inventory import PodInfo, build_report
from agent.logs import follow_file
from meshplane.config_error import ConfigError
from meshplane.netaddr import parse_listen
from meshplane.validate import Fields, Node
from meshplane.yamlconf import load_yaml

log = logging.getLogger(__name__)

_REQUIRED = ("namespace", "workload", "instance")
#: ``adminAddress`` (a gateway's plain admin port) or ``diagnosticsAddress`` (a
#: sidecar's mTLS diagnostics port), exactly one.
_ADDRESSES = ("adminAddress", "diagnosticsAddress")
_OPTIONAL = ("logFile", *_ADDRESSES)
_POD_REQUIRED = ("namespace", "name", "uid")
_POD_OPTIONAL = ("serviceAccount", "ip", "services")
MAX_UID = 64  # a Kubernetes uid is 36


@dataclass(frozen=True)
class StaticFile:
    """What the file lists."""

    proxies: list[Proxy]
    pods: list[PodInfo]


def parse_document(document: Any, source: str) -> StaticFile:
    """Validate the file's document; ConfigError names the line, entry and field."""
    root = Node(document, source=source)
    if not isinstance(document, dict):
        return StaticFile(parse_entries(document, source), [])
    fields = root.fields((), ("proxies", "pods"))
    pods = fields.present("pods")
    proxies = fields.present("proxies")
    return StaticFile(
        _proxies(proxies) if proxies is not None else [],
        _pods(pods) if pods is not None else [],
    )


def parse_entries(document: Any, source: str) -> list[Proxy]:
    """The proxies of the file's document (see :func:`parse_document`)."""
    if isinstance(document, dict):
        return parse_document(document, source).proxies
    root = Node(document, source=source)
    if root.value is None:
        return []
    return _proxies(root)


def _proxies(root: Node) -> list[Proxy]:
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
    given = [name for name in _ADDRESSES if f.present(name) is not None]
    if len(given) != 1:
        raise f.node.error("needs exactly one of adminAddress and diagnosticsAddress")
    address = f.node.child(given[0])
    values["address"] = address.string()
    try:
        host, port = parse_listen(values["address"])
    except ValueError as exc:
        raise address.error(str(exc)) from None
    if port == 0 or host == "0.0.0.0":
        raise address.error("needs a host and a port")
    return Proxy(
        namespace=values["namespace"],
        workload=values["workload"],
        instance=values["instance"],
        admin_address=values["address"],
        log_file=log_file.string() if log_file is not None else None,
        pod_ip=host,
        mtls=given[0] == "diagnosticsAddress",
    )


def _pods(root: Node) -> list[PodInfo]:
    pods: list[PodInfo] = []
    seen: set[tuple[str, str]] = set()
    for item in root.items(of="pods"):
        f = item.fields(_POD_REQUIRED, _POD_OPTIONAL)
        namespace, name = f.required("namespace").string(), f.required("name").string()
        uid = f.required("uid").string()
        if len(uid) > MAX_UID:
            raise item.child("uid").error(f"longer than {MAX_UID} characters")
        try:
            contract.check_workload(namespace, "pod", name)
        except contract.FieldError as exc:
            field = "name" if exc.field == "instance" else exc.field
            raise item.child(field).error(exc.message) from None
        if (namespace, name) in seen:
            raise item.child("name").error("listed twice")
        seen.add((namespace, name))
        ip = f.present("ip")
        if ip is not None:
            try:
                ipaddress.ip_address(ip.string())
            except ValueError:
                raise ip.error("must be an IP address") from None
        account = f.present("serviceAccount")
        services = f.present("services")
        pods.append(
            PodInfo(
                namespace=namespace,
                name=name,
                uid=uid,
                ip=ip.string() if ip is not None else None,
                service_account=account.string() if account is not None else None,
                services=tuple(s.string() for s in services.items(of="service names"))
                if services is not None
                else (),
            )
        )
    return pods


def load(path: Path) -> list[Proxy]:
    return load_file(path).proxies


def load_file(path: Path) -> StaticFile:
    return parse_document(load_yaml(path), str(path))


class StaticSource:
    """A :class:`~agent.discovery.ProxySource` over a file, reloaded when it changes."""

    kind = "static"

    def __init__(self, path: Path, agent_version: str) -> None:
        self.path = path
        self.agent_version = agent_version
        self._mtime = os.stat(path).st_mtime_ns
        self._file = load_file(path)  # a bad file stops the start

    async def _current(self) -> StaticFile:
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except OSError as exc:
            log.warning(
                "cannot stat the proxies file", extra={"path": str(self.path), "error": str(exc)}
            )
            return self._file
        if mtime != self._mtime:
            self._mtime = mtime
            try:
                self._file = await asyncio.to_thread(load_file, self.path)
                log.info(
                    "proxies file reloaded",
                    extra={"proxies": len(self._file.proxies), "pods": len(self._file.pods)},
                )
            except ConfigError as exc:
                log.error(
                    "proxies file rejected; keeping the last good list", extra={"error": str(exc)}
                )
        return self._file

    async def proxies(self) -> list[Proxy]:
        return (await self._current()).proxies

    async def inventory(self) -> dict[str, Any]:
        current = await self._current()
        return build_report(
            current.proxies,
            provider="static",
            agent_version=self.agent_version,
            pods=current.pods,
        )

    async def logs(self, proxy: Proxy, request: LogRequest) -> AsyncIterator[LogEntry]:
        if not proxy.log_file:
            raise LogsUnavailable(f"{proxy.name} has no logFile in {self.path}")
        async for entry in follow_file(proxy.log_file, request):
            yield entry

    async def close(self) -> None:
        return None
