"""The Envoy admin API as the agent may use it: an allow-list and the requests it builds.

Diagnostics reach proxies through the agent, and Envoy's admin API can also
stop a proxy (``/quitquitquit``), fail its health checks
(``/healthcheck/fail``), drain its listeners or dump its private keys
(``/certs``). So the agent never forwards a path: every admin request is
built here from a typed operation, and :func:`check` admits only the read
endpoints (``/stats``, ``/clusters``, ``/config_dump``, ``/server_info``)
and ``/logging``, with their own query parameters, URL-encoded, so that no
value can add a parameter or change the path. The HTTP adapter
(:mod:`agent.envoy_admin`) sends nothing that :func:`check` refused.

The table itself is :data:`meshplane.admin_allowlist.ALLOWED` (a sidecar's
diagnostics listener serves the same paths). Pure: no I/O; table-tested in
``tests/agent/test_admin_allowlist.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from agent import contract
from meshplane.admin_allowlist import ALLOWED, Endpoint

__all__ = ["ALLOWED", "AdminRefused", "AdminRequest", "Endpoint", "check"]


class AdminRefused(Exception):
    """A request outside the allow-list; it is never sent."""


@dataclass(frozen=True)
class AdminRequest:
    method: str
    path: str
    query: tuple[tuple[str, str], ...] = ()

    def target(self) -> str:
        """The request target, every name and value percent-encoded."""
        if not self.query:
            return self.path
        parts = [quote(k, safe="") + ("=" + quote(v, safe="") if v else "") for k, v in self.query]
        return self.path + "?" + "&".join(parts)


def check(request: AdminRequest) -> AdminRequest:
    """Return ``request`` if the allow-list admits it; raise AdminRefused otherwise."""
    endpoint = ALLOWED.get(request.path)
    if endpoint is None:
        raise AdminRefused(f"admin path {request.path[:80]!r} is not allowed")
    if request.method != endpoint.method:
        raise AdminRefused(f"{request.method} {request.path} is not allowed")
    seen: set[str] = set()
    for name, value in request.query:
        if name not in endpoint.params:
            raise AdminRefused(f"parameter {name[:40]!r} is not allowed on {request.path}")
        if name in seen:
            raise AdminRefused(f"parameter {name!r} given twice")
        seen.add(name)
        if any(ord(c) < 0x20 or c == "\x7f" for c in value):
            raise AdminRefused(f"parameter {name!r} holds a control character")
    return request


def cluster_stats() -> AdminRequest:
    return check(AdminRequest("GET", "/clusters", (("format", "json"),)))


def server_info() -> AdminRequest:
    return check(AdminRequest("GET", "/server_info"))


def server_stats(filter_regex: str, used_only: bool) -> AdminRequest:
    contract.check_filter(filter_regex)
    query: list[tuple[str, str]] = [("format", "json")]
    if filter_regex:
        query.append(("filter", filter_regex))
    if used_only:
        query.append(("usedonly", ""))
    return check(AdminRequest("GET", "/stats", tuple(query)))


def config_dump(resource: str, mask: str, include_eds: bool) -> AdminRequest:
    contract.check_config_dump(resource, mask)
    query: list[tuple[str, str]] = []
    if resource:
        query.append(("resource", resource))
    if mask:
        query.append(("mask", mask))
    if include_eds:
        query.append(("include_eds", ""))
    return check(AdminRequest("GET", "/config_dump", tuple(query)))


def get_loggers() -> AdminRequest:
    return check(AdminRequest("POST", "/logging"))


def set_loggers(level: str, loggers: dict[str, str]) -> AdminRequest:
    """``level=L`` for every logger, else ``paths=a:L1,b:L2`` for the named ones."""
    contract.check_loggers(level, loggers)
    if level:
        return check(AdminRequest("POST", "/logging", (("level", level),)))
    paths = ",".join(f"{name}:{value}" for name, value in sorted(loggers.items()))
    return check(AdminRequest("POST", "/logging", (("paths", paths),)))


def parse_loggers(text: str) -> dict[str, str]:
    """``/logging``'s answer (``active loggers:`` then ``  name: level`` lines) as a map."""
    levels: dict[str, str] = {}
    for line in text.splitlines():
        if not line.startswith("  "):
            continue
        name, sep, level = line.strip().partition(": ")
        if sep and level in contract.LEVELS:
            levels[name] = level
    return levels
