"""Every metric a dashboard queries is exported by the running service.

The services are started as real subprocesses through their console scripts
(``services.collect_expositions``), so a renamed metric, a dropped label or
a changed CLI flag breaks this test instead of silently emptying a panel in
someone's Grafana.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mgmt_api.dashboards import get_dashboard, list_dashboards

from .promql import (
    grouping_labels,
    matcher_equalities,
    matcher_labels,
    metric_names,
    template_query_metrics,
)
from .services import Exposition, collect_expositions

# Which service's /metrics each dashboard is drawn from.
SERVICE_OF = {"extauthz": "extauthz", "ratelimit": "ratelimit", "mgmt-api": "mgmt-api"}
# Added by Prometheus at scrape time, never by the service itself.
TARGET_LABELS = frozenset({"job", "instance"})
# Label values a dashboard may select that no honest traffic can produce in
# the test (an unexpected failure inside the server). Every other exact
# matcher value (result="deny", config="ratelimit", ...) must be seen live.
UNOBSERVABLE_VALUES = frozenset({("meshplane_extauthz_checks_total", "reason", "internal_error")})


@pytest.fixture(scope="module")
def expositions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Exposition]:
    return collect_expositions(tmp_path_factory.mktemp("dashboards-live"))


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def queries(name: str) -> list[tuple[str, str, bool]]:
    """(where, query, is a variable query) for every panel target and variable."""
    raw = get_dashboard(name)
    assert raw is not None
    dash = json.loads(raw)
    found = [
        (f"panel {panel['title']!r}", target["expr"], False)
        for panel in _panels(dash["panels"])
        for target in panel.get("targets", [])
    ]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]
            text = query["query"] if isinstance(query, dict) else query
            found.append((f"variable ${var['name']}", text, True))
    return found


def test_every_dashboard_has_a_service() -> None:
    assert {d["name"] for d in list_dashboards()} == set(SERVICE_OF)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("name", sorted(SERVICE_OF))
def test_every_queried_metric_is_exported(name: str, expositions: dict[str, Exposition]) -> None:
    exported = expositions[SERVICE_OF[name]]
    missing: list[str] = []
    bad_labels: list[str] = []
    for where, expr, is_variable in queries(name):
        names = template_query_metrics(expr) if is_variable else metric_names(expr)
        assert names, f"{name}: {where}: no metric in {expr!r}"
        for metric in sorted(names):
            if exported.family_of(metric) is None:
                missing.append(f"{where}: {metric}")
        # Label names must exist too: a matcher or a `by` on a label the
        # service never sets selects nothing (or collapses every series).
        known = set().union(*(exported.label_names(m) for m in names)) | TARGET_LABELS
        for metric, labels in matcher_labels(expr).items():
            for label in sorted(labels - TARGET_LABELS - exported.label_names(metric)):
                bad_labels.append(f"{where}: {metric}{{{label}}}")
        for label in sorted(grouping_labels(expr) - known):
            bad_labels.append(f"{where}: by ({label})")
        for metric, label, value in sorted(matcher_equalities(expr)):
            if label in TARGET_LABELS or (metric, label, value) in UNOBSERVABLE_VALUES:
                continue
            if label in exported.label_names(metric) and value not in exported.label_values(
                metric, label
            ):
                bad_labels.append(f'{where}: {metric}{{{label}="{value}"}} never seen')
    problems = [f"metric not exported: {m}" for m in missing]
    problems += [f"label not exported: {b}" for b in bad_labels]
    assert not problems, f"{name} (against {SERVICE_OF[name]}'s /metrics):\n" + "\n".join(problems)


def test_live_families_cover_the_documented_runtime_metrics(
    expositions: dict[str, Exposition],
) -> None:
    # Guards the test itself: if the traffic stopped reaching a family (for
    # instance no JWKS fetch any more), the dashboards test above would fail
    # with a confusing "missing" list; this says what the harness expects.
    assert expositions["extauthz"].family_of("meshplane_extauthz_key_refreshes_total")
    assert expositions["ratelimit"].family_of("meshplane_ratelimit_store_errors_total")
    for service in ("extauthz", "ratelimit"):
        assert expositions[service].family_of("meshplane_config_reloads_total")


def test_docs_mention_every_dashboard() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "dashboards.md").read_text()
    for name in SERVICE_OF:
        assert f"/v2/dashboards/{name}" in docs or f"`{name}`" in docs
