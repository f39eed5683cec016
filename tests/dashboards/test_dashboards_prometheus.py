"""Every query of every shipped dashboard, evaluated by a real Prometheus after real traffic.

One module-scoped stack (``tests/support/gateway.py``): mgmt-api, a
redis-server, ratelimit and extauthz subscribed to mgmt-api's policy stream,
a gateway Envoy configured over ADS with a JWT policy and a rate limit, the
upstream, and a ``meshplane-agent`` whose static proxy is the gateway.
Debian's ``prometheus`` scrapes each of them every second (the gateway on
its admin port's ``/stats/prometheus``, mgmt-api with the admin's
credentials) **before** any traffic, so the counters' zero samples are in
the TSDB; then requests go through the gateway (allowed, 403, 429, 404),
REST calls to mgmt-api, and one diagnostics call through the agent's tunnel.

The test then takes each dashboard as Grafana would: it evaluates the
template variables' queries (``label_values``) to get real ``$job`` and
``$instance`` values, substitutes them and Grafana's interval variables,
and sends every panel target to ``/api/v1/query``. It requires that no
query is refused, that each metric and label a query names exists in
Prometheus, and that each panel draws something, except the panels in
:data:`ALLOWED_EMPTY`, each with the reason the traffic cannot fill it.

Before the traffic it also reads each process's first ``/metrics`` page:
the counters of closed label sets must already be there, at 0.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.metrics import CALL_CODES, OPERATIONS
from extauthz.cli import mint_demo_token
from extauthz.metrics import ALLOW_REASONS, MODES, REFRESH_RESULTS, REFRESH_TRIGGERS
from extauthz.reasons import Reason
from mgmt_api.dashboards import get_dashboard, list_dashboards
from mgmt_api.distribution.metrics import EVENTS, KINDS
from ratelimit.metrics import DECISION_RESULTS, STORE_ERROR_REASONS
from tests.mgmt_api.harness import ADMIN_PASSWORD
from tests.support.gateway import BASE, CLUSTER, GatewayStack
from tests.support.net import free_port
from tests.support.processes import Service, wait_until

from .prometheus import Prometheus, QueryError, expand, has_values, regex_value, variable_query
from .promql import grouping_labels, matcher_labels, metric_names
from .services import Samples, parse_samples, scrape

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="Debian's prometheus package (scripts/setup installs it)",
)

SECRET = "prometheus-dashboards-secret-0123456789"
LIMIT = 3  # requests per hour on /headers (no window ends mid-test): the 4th and 5th are 429

# Panels that no honest traffic of this test can fill, by dashboard and
# title, with why. Their queries are still evaluated (no error allowed), and
# the metrics and labels they name must exist.
ALLOWED_EMPTY: dict[tuple[str, str], str] = {
    ("mgmt-api", "Errors/s by route"): "only 5xx series; mgmt-api answers no 5xx here",
    ("gateway", "Upstream 5xx/s by cluster"): "the upstream answers no 5xx here",
}
#: Panels whose series this stack cannot have (it runs no sidecar and no local JWT
#: rules): their queries must still evaluate here, but their metric and label names
#: are checked against real gateway and sidecar Envoys' /stats/prometheus, with
#: every denial kind counted, by tests/mesh/test_denials.py.
CHECKED_ELSEWHERE: dict[tuple[str, str], str] = {
    ("gateway", "Denials/s by reason at gateways"): "jwt_authn and rbac need local JWT rules",
    ("gateway", "Denials/s by reason at sidecars"): "no sidecar runs here",
}
# Added by Prometheus at scrape time, never by the target.
TARGET_LABELS = frozenset({"job", "instance"})


@dataclass
class Run:
    """The stack's scrape targets, what they showed before any traffic, and Prometheus."""

    prometheus: Prometheus
    fresh: dict[str, Samples] = field(default_factory=dict)
    evaluated_at: float = 0.0


def _agent(stack: GatewayStack) -> tuple[Service, int]:
    """A meshplane-agent of the stack's cluster whose only proxy is the gateway."""
    gateway = stack.gateways[0]
    proxies = stack.tmp / "proxies.yaml"
    admin = gateway.envoy.admin_url.removeprefix("http://")
    proxies.write_text(
        yaml.safe_dump(
            [{"namespace": "edge", "workload": "gw", "instance": gateway.instance,
              "adminAddress": admin}]
        )
    )  # fmt: skip
    port = free_port()
    args = [
        "agent",
        "--control-plane", f"grpc://127.0.0.1:{stack.attach.grpc_port}",
        "--cluster", f"gw/{CLUSTER}", "--credentials", str(stack.credentials),
        "--listen", f"127.0.0.1:{port}", "--static-proxies", str(proxies),
    ]  # fmt: skip
    return Service(args, port, stack.tmp / "agent.log").start(), port


def _jobs(stack: GatewayStack, agent_port: int) -> list[dict[str, Any]]:
    password = stack.tmp / "admin-password"
    password.write_text(ADMIN_PASSWORD + "\n")
    assert stack.mgmt is not None
    gateway_admin = stack.gateways[0].envoy.admin_url.removeprefix("http://")

    def job(name: str, target: str, **extra: Any) -> dict[str, Any]:
        return {"job_name": name, "static_configs": [{"targets": [target]}], **extra}

    return [
        job("extauthz", f"127.0.0.1:{stack.metrics_ports['extauthz']}"),
        job("ratelimit", f"127.0.0.1:{stack.metrics_ports['ratelimit']}"),
        job(
            "mgmt-api",
            f"127.0.0.1:{stack.mgmt.port}",
            basic_auth={"username": "admin", "password_file": str(password)},
        ),
        job("gateway", gateway_admin, metrics_path="/stats/prometheus"),
        job("agent", f"127.0.0.1:{agent_port}"),
    ]


def _fresh_pages(stack: GatewayStack, agent_port: int) -> dict[str, Samples]:
    assert stack.mgmt is not None
    ports = stack.metrics_ports
    return {
        "extauthz": parse_samples(scrape(f"http://127.0.0.1:{ports['extauthz']}/metrics")),
        "ratelimit": parse_samples(scrape(f"http://127.0.0.1:{ports['ratelimit']}/metrics")),
        "mgmt-api": parse_samples(scrape(f"{stack.mgmt.url}/metrics", ("admin", ADMIN_PASSWORD))),
        "agent": parse_samples(scrape(f"http://127.0.0.1:{agent_port}/metrics")),
    }


def _traffic(stack: GatewayStack) -> None:
    """A new version for every instance; one agent call; allowed, denied (403)
    and over-limit (429) requests through the gateway; a 404 from mgmt-api."""
    stack.rate_limit("secure.web-limit", "web", (LIMIT, "Hour"), (1000, "Minute"))
    stack.converged()
    body = {"namespace": "edge", "workload": "gw", "filter": "^server.live$"}
    path = f"{BASE}/clusters/{CLUSTER}/proxytools/serverstats"
    wait_until(
        lambda: stack.admin.post(path, json=body).status_code == 200,
        timeout=60,
        what="a diagnostics call through the agent",
    )
    gateway = stack.gateways[0]
    token = mint_demo_token(SECRET, "/headers", 600)
    statuses = [gateway.get("/headers", token).status_code for _ in range(LIMIT + 2)]
    assert statuses == [200] * LIMIT + [429, 429], statuses
    assert gateway.get("/headers").status_code == 403
    assert gateway.get("/headers", "not-a-token").status_code == 403
    assert stack.admin.get(f"{BASE}/clusters/no-such-cluster").status_code == 404


# Conditions that say the traffic above has been scraped: Envoy flushes its
# histograms every 5 s, the services their counters every 0.5 s.
SCRAPED = (
    'sum(envoy_cluster_upstream_rq_time_count{envoy_cluster_name="backend/default/app"}) >= 3',
    'sum(envoy_http_downstream_rq_time_count{envoy_http_conn_manager_prefix!="admin"}) >= 7',
    f"sum(meshplane_extauthz_checks_total) >= {LIMIT + 4}",
    f"sum(meshplane_ratelimit_decisions_total) >= {LIMIT + 2}",
    "sum(meshplane_agent_call_duration_seconds_count) >= 1",
    'sum(mgmt_api_http_requests_total{status="404"}) >= 1',
    'sum(increase(mgmt_api_distribution_events_total{event="ack"}[1m])) > 0',
)


def _scraped(prometheus: Prometheus) -> float:
    """Wait until every SCRAPED condition holds; the time to evaluate the dashboards at."""
    pending = list(SCRAPED)

    def done() -> bool:
        pending[:] = [c for c in pending if not prometheus.query(c)]
        return not pending

    try:
        wait_until(done, timeout=120, what="the traffic in Prometheus")
    except AssertionError:
        raise AssertionError(f"never true: {pending}") from None
    # A series the traffic created (a counter Envoy makes on first use) has one
    # sample so far, and rate() needs two: every target is scraped, successfully,
    # twice more (a loaded machine delays and fails scrapes) before the panels are
    # evaluated.
    since = time.time()
    wait_until(
        lambda: (
            prometheus.query(f"min(timestamp(up == 1)) > {since + 1.5:.3f}")
            and prometheus.query(f"count(up == 1) == {len(prometheus.query('up'))}")
        ),
        timeout=60,
        what="two more scrapes of every target",
    )
    return time.time()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = Path(tmp_path_factory.mktemp("prometheus-dashboards"))
    (tmp / "stack").mkdir()
    stack = GatewayStack(tmp / "stack", metrics=True)
    agent: Service | None = None
    prometheus: Prometheus | None = None
    try:
        stack.backend("default.app")
        stack.route("secure.web", "/headers", backend="default.app")
        stack.jwt_security(SECRET)
        stack.rate_limit("secure.web-limit", "web", (LIMIT, "Hour"))
        stack.gateway()
        stack.converged()
        agent, agent_port = _agent(stack)
        jobs = _jobs(stack, agent_port)
        result = Run(Prometheus(tmp / "prometheus", jobs))
        prometheus = result.prometheus
        result.fresh = _fresh_pages(stack, agent_port)
        prometheus.wait_targets_up({j["job_name"] for j in jobs})
        # Two samples of every target before the traffic, so rate() sees its start.
        wait_until(
            lambda: len(prometheus.query("count_over_time(up[1m]) >= 2")) == len(jobs),
            timeout=60,
            what="two scrapes of every target",
        )
        _traffic(stack)
        result.evaluated_at = _scraped(prometheus)
        yield result
    finally:
        if prometheus is not None:
            prometheus.close()
        if agent is not None:
            agent.stop()
        stack.close()


# --- the dashboards, as Grafana sends them -----------------------------------------


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _model(name: str) -> dict[str, Any]:
    raw = get_dashboard(name)
    assert raw is not None
    loaded: dict[str, Any] = json.loads(raw)
    return loaded


def _variables(name: str, prometheus: Prometheus, at: float) -> tuple[dict[str, str], list[str]]:
    """Each query variable's value (all it lists, as a regex), in order; and problems."""
    values: dict[str, str] = {}
    problems: list[str] = []
    for var in _model(name)["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        expr, label = variable_query(expand(query, values))
        try:
            result = prometheus.query(expr, at)
        except QueryError as exc:
            problems.append(f"variable ${var['name']}: {expr}: {exc}")
            result = []
        listed = sorted({s["metric"].get(label, "") for s in result} - {""}) if label else []
        if not listed:
            problems.append(f"variable ${var['name']}: {expr} lists nothing")
        values[var["name"]] = regex_value(listed) if listed else var.get("allValue") or ".*"
    return values, problems


def _names_exist(expr: str, prometheus: Prometheus) -> list[str]:
    """Each metric the query names has series, with each label its matchers or ``by`` use."""
    problems = []
    labels: set[str] = set(TARGET_LABELS)
    for metric in sorted(metric_names(expr)):
        found = prometheus.label_names(metric)
        if not found:
            problems.append(f"no series of {metric}")
        labels |= found
        for label in sorted(matcher_labels(expr).get(metric, set()) - found - TARGET_LABELS):
            problems.append(f"{metric} has no label {label}")
    problems += [
        f"no metric of it has the label {b}" for b in sorted(grouping_labels(expr) - labels)
    ]
    return problems


def _evaluate(name: str, prometheus: Prometheus, at: float) -> tuple[list[str], list[str]]:
    """(queries refused, panels without data or naming unknown series) of one dashboard,
    each query evaluated at ``at`` (a time when the traffic is inside every window)."""
    variables, problems = _variables(name, prometheus, at)
    refused: list[str] = []
    for panel in _panels(_model(name)["panels"]):
        drawn = False
        for target in panel.get("targets", []):
            expr = expand(target["expr"], variables)
            try:
                drawn |= has_values(prometheus.query(expr, at))
            except QueryError as exc:
                refused.append(f"{name}: {panel['title']!r}: {expr}: {exc}")
                continue
            if (name, panel["title"]) in CHECKED_ELSEWHERE:
                continue
            problems += [
                f"{panel['title']!r}: {p}" for p in _names_exist(target["expr"], prometheus)
            ]
        exempt = ALLOWED_EMPTY.keys() | CHECKED_ELSEWHERE.keys()
        if panel.get("targets") and not drawn and (name, panel["title"]) not in exempt:
            problems.append(f"{panel['title']!r}: no data")
    return refused, [f"{name}: {p}" for p in problems]


@pytest.mark.timeout(300)
def test_every_dashboard_query_evaluates_with_data(run: Run) -> None:
    refused: list[str] = []
    problems: list[str] = []
    for dashboard in list_dashboards():
        r, p = _evaluate(dashboard["name"], run.prometheus, run.evaluated_at)
        refused += r
        problems += p
    assert not refused, "Prometheus refused:\n" + "\n".join(refused)
    assert not problems, "\n".join(problems)
    if os.environ.get("MESHPLANE_DASHBOARD_SNAPSHOT"):  # for docs/observability.md
        for dashboard in list_dashboards():
            print("\n".join(snapshot(dashboard["name"], run.prometheus, run.evaluated_at)))


def snapshot(name: str, prometheus: Prometheus, at: float) -> list[str]:
    """A text "screenshot" of one dashboard at ``at``: each panel's first series and value.

    Printed by ``MESHPLANE_DASHBOARD_SNAPSHOT=1 pytest -s -k every_dashboard`` for
    docs/observability.md, from the same real Prometheus and traffic.
    """
    variables, _ = _variables(name, prometheus, at)
    lines = [f"[{_model(name)['title']}]"]
    for panel in _panels(_model(name)["panels"]):
        if not panel.get("targets"):
            continue
        shown = "(no data)"
        for target in panel["targets"]:
            result = prometheus.query(expand(target["expr"], variables), at)
            if has_values(result):
                first = result[0]
                labels = ",".join(
                    f"{k}={v}" for k, v in sorted(first["metric"].items()) if k not in TARGET_LABELS
                )
                shown = f"{labels or '(total)'} = {float(first['value'][1]):.3g}"
                if len(result) > 1:
                    shown += f"  (+{len(result) - 1} series)"
                break
        lines.append(f"  {panel['title']:<44} {shown}")
    return lines


def test_allowed_empty_panels_exist() -> None:
    """The exemption list names real panels only (a renamed panel must not stay exempt)."""
    titles = {
        (d["name"], p["title"])
        for d in list_dashboards()
        for p in _panels(_model(d["name"])["panels"])
    }
    assert set(ALLOWED_EMPTY) <= titles, set(ALLOWED_EMPTY) - titles
    assert set(CHECKED_ELSEWHERE) <= titles, set(CHECKED_ELSEWHERE) - titles


# --- counters at zero, on each process's first page -------------------------------


def _not_zero(samples: Samples, name: str, expected: list[dict[str, str]]) -> list[str]:
    """The expected label sets of ``name`` that are absent or not 0."""
    return [
        f"{name}{labels} = {samples.get((name, frozenset(labels.items())))}"
        for labels in expected
        if samples.get((name, frozenset(labels.items()))) != 0.0
    ]


def test_extauthz_counters_start_at_zero(run: Run) -> None:
    samples = run.fresh["extauthz"]
    checks = [
        {"mode": m, "result": "allow" if r in ALLOW_REASONS else "deny", "reason": r.value}
        for m in MODES
        for r in Reason
    ]
    refreshes = [{"trigger": t, "result": r} for t in REFRESH_TRIGGERS for r in REFRESH_RESULTS]
    problems = _not_zero(samples, "meshplane_extauthz_checks_total", checks)
    problems += _not_zero(samples, "meshplane_extauthz_key_refreshes_total", refreshes)
    problems += _not_zero(
        samples, "meshplane_extauthz_check_duration_seconds_count", [{"mode": m} for m in MODES]
    )
    problems += _not_zero(
        samples, "meshplane_config_reloads_total", [{"config": "extauthz", "result": "error"}]
    )
    assert not problems, "\n".join(problems)


def test_ratelimit_counters_start_at_zero(run: Run) -> None:
    samples = run.fresh["ratelimit"]
    problems = _not_zero(
        samples, "meshplane_ratelimit_decisions_total", [{"result": r} for r in DECISION_RESULTS]
    )
    problems += _not_zero(
        samples,
        "meshplane_ratelimit_store_errors_total",
        [{"reason": r} for r in STORE_ERROR_REASONS],
    )
    # The rules mgmt-api delivered: the per-rule counters exist before their first hit.
    rules = [
        {"domain": dict(key)["domain"], "rule": dict(key)["rule"]}
        for name, key in samples
        if name == "meshplane_ratelimit_total_hits_total"
    ]
    assert rules, "no per-rule counter before the first hit"
    for family in ("total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode"):
        problems += _not_zero(samples, f"meshplane_ratelimit_{family}_total", rules)
    problems += _not_zero(
        samples, "meshplane_config_reloads_total", [{"config": "ratelimit", "result": "error"}]
    )
    assert not problems, "\n".join(problems)


def test_mgmt_api_distribution_counters_start_at_zero(run: Run) -> None:
    samples = run.fresh["mgmt-api"]
    # Versions were sent and ACKed while the stack converged; nothing was NACKed.
    problems = _not_zero(
        samples, "mgmt_api_distribution_events_total", [{"kind": k, "event": "nack"} for k in KINDS]
    )
    problems += _not_zero(
        samples, "mgmt_api_distribution_nacking_instances", [{"kind": k} for k in KINDS]
    )
    names = {name for name, _ in samples}
    present = {
        (dict(key)["kind"], dict(key)["event"])
        for name, key in samples
        if name == "mgmt_api_distribution_events_total"
    }
    assert present >= {(k, e) for k in KINDS for e in EVENTS}, names
    histograms = {
        dict(key)["kind"]
        for name, key in samples
        if name == "mgmt_api_distribution_propagation_seconds_count"
    }
    assert histograms >= set(KINDS), names
    assert not problems, "\n".join(problems)


def test_agent_counters_start_at_zero(run: Run) -> None:
    samples = run.fresh["agent"]
    calls = [{"operation": op, "code": code} for op in OPERATIONS for code in CALL_CODES]
    problems = _not_zero(samples, "meshplane_agent_calls_total", calls)
    problems += _not_zero(samples, "meshplane_agent_inventory_reports_total", [{"result": "error"}])
    assert not problems, "\n".join(problems)
