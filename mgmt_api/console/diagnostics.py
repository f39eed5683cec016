"""The console's proxy diagnostics page, as data (pure).

Four read views over ``…/proxytools`` (server stats, upstream clusters,
config dump, logger levels) and one write (set logger levels). The proxy is
picked from a list (:func:`mgmt_api.console.mesh.proxies`), never typed;
answers are shown as tables and per-section blocks (:func:`readable`), as
the agent redacted them. Each view names the API endpoint
and the form fields it sends; the API validates them (a bad regex is its
400 naming the field) and checks the permissions: READ on the cluster for
the views, WRITE for setting levels, as for every other client.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

LEVELS = ("trace", "debug", "info", "warning", "error", "critical", "off")
MAX_FIELD = 256  # the longest value the page sends for one field


@dataclass(frozen=True)
class View:
    slug: str
    title: str
    endpoint: str  # under …/proxytools
    fields: tuple[str, ...]  # optional fields of the request body, besides the workload


VIEWS: dict[str, View] = {
    v.slug: v
    for v in (
        View("stats", "Server stats", "serverstats", ("filter",)),
        View("clusters", "Upstream clusters", "clusterstats", ()),
        View("config", "Config dump", "configdump", ("resource",)),
        View("loggers", "Logger levels", "loggerlevels", ()),
    )
}


def workload(query: Mapping[str, str]) -> dict[str, str] | None:
    """The workload selection of the form, or None until namespace and workload are given."""
    picked = {
        k: query.get(k, "").strip()[:MAX_FIELD] for k in ("namespace", "workload", "instance")
    }
    if not picked["namespace"] or not picked["workload"]:
        return None
    return {k: v for k, v in picked.items() if v}


def request_body(view: View, query: Mapping[str, str]) -> dict[str, str] | None:
    """The JSON body of ``view``'s API call from the form, or None when no workload is chosen."""
    selected = workload(query)
    if selected is None:
        return None
    extra = {f: query.get(f, "").strip()[:MAX_FIELD] for f in view.fields}
    return {**selected, **{k: v for k, v in extra.items() if v}}


def set_levels_body(form: Mapping[str, str]) -> dict[str, str | dict[str, str]] | None:
    """``PUT …/loggerlevels``: one level for every logger, or one logger's level."""
    selected = workload(form)
    level = form.get("level", "")
    if selected is None or level not in LEVELS:
        return None
    logger = form.get("logger", "").strip()[:MAX_FIELD]
    return {**selected, **({"loggers": {logger: level}} if logger else {"level": level})}


# ---- answers, readable ------------------------------------------------------------

#: Rows shown per table; the rest is counted, not rendered (a stats dump has thousands).
MAX_ROWS = 500


@dataclass(frozen=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    more: int = 0  # rows left out past MAX_ROWS


@dataclass(frozen=True)
class InstanceAnswer:
    """One proxy's answer: its error, or tables and titled JSON blocks."""

    title: str
    error: str = ""
    tables: tuple[Table, ...] = ()
    sections: tuple[tuple[str, str], ...] = ()  # (title, pretty JSON)
    notes: tuple[str, ...] = field(default=())


def _table(headers: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> Table:
    return Table(headers, tuple(rows[:MAX_ROWS]), max(0, len(rows) - MAX_ROWS))


def _stats(entry: Mapping[str, Any]) -> InstanceAnswer:
    rows = [
        (str(s.get("name", "")), str(s.get("value", s.get("histograms", ""))))
        for s in entry.get("stats") or []
        if isinstance(s, Mapping)
    ]
    return InstanceAnswer("", tables=(_table(("Stat", "Value"), rows),))


def _address(host: Mapping[str, Any]) -> str:
    socket = (host.get("address") or {}).get("socket_address") or {}
    if socket:
        return f"{socket.get('address', '')}:{socket.get('port_value', '')}"
    return str((host.get("address") or {}).get("pipe", {}).get("path", ""))


def _health(host: Mapping[str, Any]) -> str:
    health = host.get("health_status") or {}
    flags = [k for k, v in health.items() if v is True]
    return ", ".join(flags) or str(health.get("eds_health_status", "HEALTHY"))


def _clusters(entry: Mapping[str, Any]) -> InstanceAnswer:
    rows = []
    for cluster in (entry.get("clusterStats") or {}).get("cluster_statuses") or []:
        hosts = cluster.get("host_statuses") or []
        if not hosts:
            rows.append((str(cluster.get("name", "")), "—", "no endpoint"))
        for host in hosts:
            rows.append((str(cluster.get("name", "")), _address(host), _health(host)))
    return InstanceAnswer("", tables=(_table(("Cluster", "Endpoint", "Health"), rows),))


def _config(entry: Mapping[str, Any]) -> InstanceAnswer:
    sections = []
    for config in (entry.get("configDump") or {}).get("configs") or []:
        kind = str(config.get("@type", "")).rsplit(".", 1)[-1] or "config"
        sections.append((kind, json.dumps(config, indent=2)))
    notes: tuple[str, ...] = () if sections else ("The proxy has no configuration of that kind.",)
    if entry.get("redactedFields"):
        notes = (f"{entry['redactedFields']} secret values were redacted by the agent.",)
    return InstanceAnswer("", sections=tuple(sections), notes=notes)


def _loggers(entry: Mapping[str, Any]) -> InstanceAnswer:
    rows = sorted((str(k), str(v)) for k, v in (entry.get("levels") or {}).items())
    return InstanceAnswer("", tables=(_table(("Logger", "Level"), rows),))


_READERS = {"stats": _stats, "clusters": _clusters, "config": _config, "loggers": _loggers}


def readable(view: View, answer: Mapping[str, Any]) -> list[InstanceAnswer]:
    """Each instance of a ``…/proxytools`` answer as tables or sections (its error if it failed)."""
    out = []
    for entry in answer.get("instances") or []:
        title = f"{entry.get('namespace')}/{entry.get('workload')} ({entry.get('instance')})"
        error = entry.get("error")
        if error:
            out.append(InstanceAnswer(title, error=str(error.get("message") or error)))
            continue
        body = _READERS[view.slug](entry)
        out.append(
            InstanceAnswer(title, tables=body.tables, sections=body.sections, notes=body.notes)
        )
    return out
