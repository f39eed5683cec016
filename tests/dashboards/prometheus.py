"""A real Prometheus (Debian's ``prometheus``) for the tests, and Grafana's query expansion.

:class:`Prometheus` runs the binary on a free port with a scrape config the
test writes, and answers instant queries through ``/api/v1/query``.
:func:`expand` replaces Grafana's variables in a query as Grafana does
before sending it, so what Prometheus evaluates is what a dashboard sends.
"""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support.net import free_port
from tests.support.processes import terminate, wait_until

# What Grafana substitutes for its built-in interval variables. With a 1 s
# scrape, Grafana's $__rate_interval is at least 4 s; the test uses wider
# windows so that the traffic, sent once, stays inside them while queries run.
BUILTINS = {
    "__rate_interval": "60s",
    "__interval": "2s",
    "__range": "5m",
    "__range_s": "300",
}


class QueryError(Exception):
    """Prometheus refused a query (bad syntax, bad types...)."""


class Prometheus:
    """``prometheus`` scraping ``jobs`` every second, its TSDB under ``work``."""

    def __init__(self, work: Path, jobs: list[dict[str, Any]]) -> None:
        work.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            "scrape_configs": jobs,
        }
        self.config = work / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config))
        self.log = work / "prometheus.log"
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        with open(self.log, "ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={work / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        self.client = httpx.Client(base_url=self.url, timeout=30)

    def close(self) -> None:
        self.client.close()
        terminate(self.proc)

    def targets(self) -> list[dict[str, Any]]:
        answer = self.client.get("/api/v1/targets").json()
        return list(answer["data"]["activeTargets"])

    def wait_targets_up(self, jobs: set[str], timeout: float = 120) -> None:
        """Every job's target is up (its last error kept for the failure message)."""
        last: dict[str, str] = {}

        def up() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(self.log.read_text()[-3000:])
            try:
                targets = self.targets()
            except (httpx.HTTPError, ValueError, KeyError):
                return False
            health = {t["labels"]["job"]: t["health"] for t in targets}
            last.update({t["labels"]["job"]: t["lastError"] for t in targets})
            return all(health.get(job) == "up" for job in jobs)

        try:
            wait_until(up, timeout=timeout, what="every target up")
        except AssertionError:
            raise AssertionError(f"targets not up: {last}") from None

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """The instant vector (or scalar, as one sample) of ``expr``; QueryError if refused."""
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        response = self.client.get("/api/v1/query", params=params)
        answer = response.json()
        if answer.get("status") != "success":
            raise QueryError(f"{answer.get('errorType')}: {answer.get('error')}")
        data = answer["data"]
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def label_names(self, metric: str) -> set[str]:
        """Every label name ``metric``'s series carry (``/api/v1/series``)."""
        answer = self.client.get("/api/v1/series", params={"match[]": metric}).json()
        return {name for series in answer["data"] for name in series} - {"__name__"}


def has_values(result: list[dict[str, Any]]) -> bool:
    """At least one sample that is a number (not NaN): what a panel can draw."""
    return any(not math.isnan(float(sample["value"][1])) for sample in result)


_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def regex_value(values: list[str]) -> str:
    """A multi-value variable inside ``=~"..."``, as Grafana formats it: ``(a|b)``."""
    escaped = [re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\\\1", v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def expand(query: str, variables: dict[str, str]) -> str:
    """``query`` with every Grafana variable replaced; KeyError names an unknown one."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2) or match.group(3)
        if name in BUILTINS:
            return BUILTINS[name]
        return variables[name]

    return _VARIABLE.sub(value, query)


_LABEL_VALUES = re.compile(r"^\s*label_values\s*\((?P<args>.*)\)\s*$", re.DOTALL)


def variable_query(query: str) -> tuple[str, str | None]:
    """A Grafana variable query as PromQL, and the label whose values it lists.

    ``label_values(selector, label)`` lists ``label`` over ``selector``'s series
    (as ``count by (label) (selector)``); ``query_result(expr)`` is ``expr``.
    """
    match = _LABEL_VALUES.match(query)
    if match is None:
        inner = re.match(r"^\s*query_result\s*\((?P<expr>.*)\)\s*$", query, re.DOTALL)
        return (inner.group("expr") if inner else query), None
    selector, _, label = match.group("args").rpartition(",")
    label = label.strip()
    return f"count by ({label}) ({selector.strip()})", label
