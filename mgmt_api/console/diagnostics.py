"""The console's proxy diagnostics page, as data (pure).

Three read views over ``…/proxytools`` (server stats, config dump, logger
levels) and one write (set logger levels). Each view names the API endpoint
and the form fields it sends; the API validates them (a bad regex is its
400 naming the field) and checks the permissions: READ on the cluster for
the views, WRITE for setting levels, as for every other client.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

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
