"""Grafana dashboards of the meshplane services, shipped as package data.

Each ``NAME.json`` next to this module is a complete Grafana dashboard model
(schemaVersion 39, a ``${datasource}`` Prometheus variable), built from the
metric names the services really export; ``tests/dashboards`` starts the
services and fails if a dashboard queries a metric none of them exposes.

The files are read with :mod:`importlib.resources` rather than from a path
relative to the source tree, so the same code works from a checkout, an
installed wheel (hatchling ships every file under the package directory) or
a zip import. Everything here is pure and side-effect free: the REST layer
(``GET /v2/dashboards`` and ``GET /v2/dashboards/{name}``) only has to call
:func:`list_dashboards` and :func:`get_dashboard` and return what they give.

``get_dashboard`` returns the file's bytes unchanged, not a re-serialised
dict: what is served is exactly what was reviewed and tested, ready to paste
into Grafana's import dialog or a provisioning directory. Files are read on
each call (they are tens of kilobytes and the endpoint is rarely hit), so
there is no cache to invalidate.
"""

from __future__ import annotations

import json
from importlib import resources
from importlib.resources.abc import Traversable
from typing import TypedDict

from mgmt_api.fqn import is_name

__all__ = ["DashboardInfo", "get_dashboard", "list_dashboards"]

_SUFFIX = ".json"
# Names are file stems; anything else (slashes, dots, "..") is simply not a
# dashboard, so a request path can never reach outside this package.


class DashboardInfo(TypedDict):
    """One entry of ``GET /v2/dashboards``."""

    name: str
    description: str


def _package() -> Traversable:
    return resources.files(__name__)


def _files() -> dict[str, Traversable]:
    """Dashboard name -> its resource, for every ``*.json`` of the package."""
    found: dict[str, Traversable] = {}
    for entry in _package().iterdir():
        if entry.is_file() and entry.name.endswith(_SUFFIX):
            name = entry.name[: -len(_SUFFIX)]
            if is_name(name):
                found[name] = entry
    return found


def list_dashboards() -> list[DashboardInfo]:
    """Every shipped dashboard as ``{name, description}``, sorted by name.

    The description is the dashboard's own ``description`` field, so the
    listing and what Grafana shows after import always agree.
    """
    infos: list[DashboardInfo] = []
    for name, entry in sorted(_files().items()):
        model = json.loads(entry.read_bytes())
        description = model.get("description") if isinstance(model, dict) else None
        infos.append(
            {"name": name, "description": description if isinstance(description, str) else ""}
        )
    return infos


def get_dashboard(name: str) -> bytes | None:
    """The JSON model of dashboard ``name`` as shipped, or None if there is none."""
    if not is_name(name):
        return None
    entry = _files().get(name)
    return entry.read_bytes() if entry is not None else None
