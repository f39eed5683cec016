"""The shipped dashboards are well-formed Grafana models, and the loader serves them.

These checks need no running service; ``test_dashboards_prometheus`` evaluates
every query with a real Prometheus scraping the real services.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mgmt_api.dashboards import get_dashboard, list_dashboards

from .promql import grouping_labels, matcher_labels, metric_names

EXPECTED = {"extauthz", "ratelimit", "mgmt-api", "gateway", "agent", "distribution"}


def model(name: str) -> dict[str, Any]:
    raw = get_dashboard(name)
    assert raw is not None, name
    loaded = json.loads(raw)
    assert isinstance(loaded, dict)
    return loaded


def all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


NAMES = sorted(EXPECTED)


def test_list_has_every_dashboard_with_its_own_description() -> None:
    listed = list_dashboards()
    assert [d["name"] for d in listed] == sorted(d["name"] for d in listed)
    assert {d["name"] for d in listed} == EXPECTED
    for entry in listed:
        assert set(entry) == {"name", "description"}
        assert entry["description"] == model(entry["name"])["description"]
        assert len(entry["description"]) > 20


@pytest.mark.parametrize("bad", ["", "nope", "../extauthz", "extauthz.json", "EXTAUTHZ", "a/b"])
def test_unknown_or_malformed_names_give_none(bad: str) -> None:
    assert get_dashboard(bad) is None


def test_get_returns_the_file_bytes_unchanged() -> None:
    from importlib import resources

    for name in NAMES:
        shipped = resources.files("mgmt_api.dashboards").joinpath(f"{name}.json").read_bytes()
        assert get_dashboard(name) == shipped


@pytest.mark.parametrize("name", NAMES)
def test_required_grafana_fields(name: str) -> None:
    dash = model(name)
    assert dash["id"] is None  # Grafana assigns ids; a fixed one breaks import
    assert dash["uid"] == f"meshplane-{name}"
    assert dash["title"].startswith("meshplane / ")
    assert "meshplane" in dash["tags"]
    assert 36 <= dash["schemaVersion"] <= 41
    assert dash["description"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in all_panels(dash["panels"])]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


def test_uids_and_titles_are_unique() -> None:
    uids = [model(n)["uid"] for n in NAMES]
    titles = [model(n)["title"] for n in NAMES]
    assert len(set(uids)) == len(uids)
    assert len(set(titles)) == len(titles)
    assert all(len(uid) <= 40 for uid in uids)  # Grafana's uid limit


@pytest.mark.parametrize("name", NAMES)
def test_every_panel_queries_prometheus_with_an_expr_and_a_unit(name: str) -> None:
    for panel in all_panels(model(name)["panels"]):
        if panel["type"] == "row":
            continue
        assert panel["title"] and panel.get("description"), panel["id"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["fieldConfig"]["defaults"].get("unit"), panel["title"]
        targets = panel["targets"]
        assert targets, panel["title"]
        ref_ids = [t["refId"] for t in targets]
        assert len(set(ref_ids)) == len(ref_ids)
        for target in targets:
            assert isinstance(target.get("expr"), str) and target["expr"].strip(), panel["title"]
            assert target["datasource"]["uid"] == "${datasource}"
            assert metric_names(target["expr"]), (panel["title"], target["expr"])
            assert target["expr"].count("(") == target["expr"].count(")")


@pytest.mark.parametrize("name", NAMES)
def test_panels_do_not_overlap(name: str) -> None:
    taken: set[tuple[int, int]] = set()
    for panel in model(name)["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24
        cells = {(pos["x"] + dx, pos["y"] + dy) for dx in range(pos["w"]) for dy in range(pos["h"])}
        assert not cells & taken, panel["title"]
        taken |= cells


# --- the PromQL name extraction the live test relies on ---------------------------


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("up", {"up"}),
        ('sum(rate(a_total{job=~"$job", x="y(z)"}[$__rate_interval]))', {"a_total"}),
        (
            "histogram_quantile(0.99, sum by (le, mode) (rate(h_bucket{m='1'}[5m])))",
            {"h_bucket"},
        ),
        ("sum without (instance) (rate(a[1m])) / on (job) group_left (x) b", {"a", "b"}),
        ("a offset 5m and b or vector(0) unless c > bool 1e3", {"a", "b", "c"}),
        ('time() - max by (instance) (g{config="extauthz"})', {"g"}),
        ("topk(10, rate(a[5m:1m]))", {"a"}),
        ('label_replace(a, "dst", "$1", "src", "(.*)")', {"a"}),
        ("sum(rate(x[${__range}])) by (le)", {"x"}),
    ],
)
def test_metric_names_are_extracted(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_matcher_and_grouping_labels() -> None:
    assert matcher_labels('rate(a{job=~"$job",result="x"}[1m]) / b{c!="d"}') == {
        "a": {"job", "result"},
        "b": {"c"},
    }
    assert grouping_labels("sum by (le, mode) (a) / on(job) b") == {"le", "mode", "job"}


def test_docs_mention_every_dashboard() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "dashboards.md").read_text()
    for name in NAMES:
        assert f"/v2/dashboards/{name}" in docs or f"`{name}`" in docs, name
