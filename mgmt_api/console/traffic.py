"""One-line summaries of a cluster's HTTPRoutes and Backends for its page (pure).

The objects come from ``/v2`` as stored (the REST shape of the compiler's
models), so a summary reads them defensively: a field the server filled
with its default may be absent from an older object.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _path(match: Mapping[str, Any]) -> str:
    path = match.get("path") or {}
    value = str(path.get("value", "/"))
    return value if path.get("type") == "Exact" else f"{value.rstrip('/')}/*"


def route_summary(obj: Mapping[str, Any]) -> str:
    """``host, host: /a/* /b → backend, backend; ...``: where a route sends what."""
    spec = obj.get("spec") or {}
    rules = []
    for rule in spec.get("rules") or []:
        paths = " ".join(_path(m) for m in rule.get("matches") or [{}])
        backends = ", ".join(str(b.get("name", "?")) for b in rule.get("backendRefs") or [])
        rules.append(f"{paths} → {backends or 'no backend'}")
    hosts = ", ".join(spec.get("hostnames") or [])
    return (f"{hosts}: " if hosts else "") + "; ".join(rules)


def backend_summary(obj: Mapping[str, Any]) -> str:
    """The endpoints of a Backend, ``address:port`` each."""
    out = []
    for endpoint in (obj.get("spec") or {}).get("endpoints") or []:
        target = endpoint.get("ip") or endpoint.get("fqdn") or {}
        host = target.get("address") or target.get("hostname") or "?"
        out.append(
            f"[{host}]:{target.get('port')}" if ":" in host else f"{host}:{target.get('port')}"
        )
    return ", ".join(out) or "no endpoint"
