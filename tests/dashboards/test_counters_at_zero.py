"""A fresh process exposes every counter of a closed label set at 0, before its first event.

Prometheus' ``rate()``/``increase()`` need two samples of a series: a series
that only appears with its first event hides that event, and an "errors"
panel or alert over it has nothing to show. So each service declares its
closed label sets at start (decisions, reasons, results, kinds, operations);
this test starts each one through its console script, sends it **no
traffic**, and reads its ``/metrics``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agent.metrics import CALL_CODES, OPERATIONS
from extauthz.metrics import ALLOW_REASONS, MODES, REFRESH_RESULTS, REFRESH_TRIGGERS
from extauthz.reasons import Reason
from mgmt_api.distribution.metrics import EVENTS, KINDS
from ratelimit.metrics import DECISION_RESULTS, STORE_ERROR_REASONS
from tests.support.net import free_port

from .services import (
    ADMIN_PASSWORD,
    BIN,
    Processes,
    Samples,
    jwks_server,
    parse_samples,
    scrape,
    start_extauthz,
    start_mgmt_api,
    start_ratelimit,
)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Samples]]:
    """Each service's first /metrics page, with no request sent to it."""
    work = tmp_path_factory.mktemp("zeros")
    procs = Processes(work)
    with jwks_server(b'{"keys": []}') as jwks_uri:
        try:
            ext = start_extauthz(procs, work, jwks_uri)
            rl = start_ratelimit(procs, work, "ratelimit")
            mgmt = start_mgmt_api(procs, work)
            procs.wait_ports("extauthz", ext["metrics"])
            procs.wait_ports("ratelimit", rl["metrics"])
            procs.wait_ports("mgmt-api", mgmt["http"], mgmt["grpc"], timeout=60)
            agent_port = _start_agent(procs, work, mgmt)
            auth = ("admin", ADMIN_PASSWORD)
            yield {
                "extauthz": parse_samples(scrape(f"http://127.0.0.1:{ext['metrics']}/metrics")),
                "ratelimit": parse_samples(scrape(f"http://127.0.0.1:{rl['metrics']}/metrics")),
                "mgmt-api": parse_samples(scrape(f"http://127.0.0.1:{mgmt['http']}/metrics", auth)),
                "agent": parse_samples(scrape(f"http://127.0.0.1:{agent_port}/metrics")),
            }
        finally:
            procs.stop_all()


def _start_agent(procs: Processes, work: Path, mgmt: dict[str, int]) -> int:
    """An agent of a new cluster, with no proxy; its /metrics port."""
    auth = ("admin", ADMIN_PASSWORD)
    base = f"http://127.0.0.1:{mgmt['http']}/v2/organizations"
    httpx.post(base, json={"name": "zero", "organization": {}}, auth=auth, timeout=30)
    created = httpx.post(
        f"{base}/zero/clusters", json={"name": "c", "cluster": {}}, auth=auth, timeout=30
    )
    created.raise_for_status()
    credentials = work / "agent-key.json"
    secret = created.json()["installTemplate"]["helm"]["secrets"]["clusterServiceAccount"]
    credentials.write_text(json.dumps(secret))
    proxies = work / "proxies.yaml"
    proxies.write_text("[]\n")
    port = free_port()
    procs.start(
        "agent",
        [str(BIN / "meshplane-agent"),
         "--control-plane", f"grpc://127.0.0.1:{mgmt['grpc']}",
         "--cluster", "zero/c", "--credentials", str(credentials),
         "--listen", f"127.0.0.1:{port}", "--static-proxies", str(proxies)],
    )  # fmt: skip
    procs.wait_ports("agent", port)
    return port


def _missing(samples: Samples, name: str, expected: list[dict[str, str]]) -> list[str]:
    """The expected label sets of ``name`` that are absent or not 0."""
    problems = []
    for labels in expected:
        value = samples.get((name, frozenset(labels.items())))
        if value != 0.0:
            problems.append(f"{name}{labels} = {value}")
    return problems


def test_extauthz_counters_start_at_zero(fresh: dict[str, Samples]) -> None:
    checks = [
        {
            "mode": mode,
            "result": "allow" if reason in ALLOW_REASONS else "deny",
            "reason": reason.value,
        }
        for mode in MODES
        for reason in Reason
    ]
    # start_extauthz's policies fetch their JWKS at start ("initial"); no other trigger ran.
    refreshes = [
        {"trigger": t, "result": r}
        for t in REFRESH_TRIGGERS
        if t != "initial"
        for r in REFRESH_RESULTS
    ]
    samples = fresh["extauthz"]
    problems = _missing(samples, "meshplane_extauthz_checks_total", checks)
    problems += _missing(samples, "meshplane_extauthz_key_refreshes_total", refreshes)
    problems += _missing(
        samples, "meshplane_config_reloads_total", [{"config": "extauthz", "result": "error"}]
    )
    problems += _missing(
        samples,
        "meshplane_extauthz_check_duration_seconds_count",
        [{"mode": mode} for mode in MODES],
    )
    assert not problems, "\n".join(problems)


def test_ratelimit_counters_start_at_zero(fresh: dict[str, Samples]) -> None:
    samples = fresh["ratelimit"]
    problems = _missing(
        samples, "meshplane_ratelimit_decisions_total", [{"result": r} for r in DECISION_RESULTS]
    )
    problems += _missing(
        samples,
        "meshplane_ratelimit_store_errors_total",
        [{"reason": r} for r in STORE_ERROR_REASONS],
    )
    # Per-rule counters come from the config (RATELIMIT_RULES: rules user and client).
    rules = [{"domain": "dash", "rule": rule} for rule in ("user", "client")]
    for family in ("total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode"):
        problems += _missing(samples, f"meshplane_ratelimit_{family}_total", rules)
    problems += _missing(
        samples, "meshplane_config_reloads_total", [{"config": "ratelimit", "result": "error"}]
    )
    assert not problems, "\n".join(problems)


def test_mgmt_api_distribution_counters_start_at_zero(fresh: dict[str, Samples]) -> None:
    samples = fresh["mgmt-api"]
    events = [{"kind": kind, "event": event} for kind in KINDS for event in EVENTS]
    problems = _missing(samples, "mgmt_api_distribution_events_total", events)
    problems += _missing(
        samples, "mgmt_api_distribution_nacking_instances", [{"kind": kind} for kind in KINDS]
    )
    assert not problems, "\n".join(problems)


def test_agent_counters_start_at_zero(fresh: dict[str, Samples]) -> None:
    samples = fresh["agent"]
    calls = [{"operation": op, "code": code} for op in OPERATIONS for code in CALL_CODES]
    problems = _missing(samples, "meshplane_agent_calls_total", calls)
    problems += _missing(samples, "meshplane_agent_inventory_reports_total", [{"result": "error"}])
    assert not problems, "\n".join(problems)
