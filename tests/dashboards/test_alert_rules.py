"""The shipped alerting rules (deploy/prometheus/alerts.yml), with Debian's promtool.

``promtool check rules`` parses every rule and its PromQL; ``promtool test
rules`` runs the unit tests in deploy/prometheus/tests/, which feed series
to each alert and require it to fire on the bad one and stay quiet on the
healthy one. Both are real promtool runs: a broken expression, a renamed
label or a wrong threshold fails them.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PROMETHEUS_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULES = PROMETHEUS_DIR / "alerts.yml"
UNIT_TESTS = sorted((PROMETHEUS_DIR / "tests").glob("*.yml"))

pytestmark = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="Debian's prometheus package (scripts/setup installs it)",
)


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_promtool_accepts_the_shipped_alert_rules() -> None:
    done = _promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 5 rules found" in done.stdout


def test_promtool_unit_tests_of_the_alert_rules_pass() -> None:
    assert UNIT_TESTS, "deploy/prometheus/tests/*.yml: no alert unit tests shipped"
    done = _promtool("test", "rules", *map(str, UNIT_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr


def test_both_scrape_configs_load_the_alert_rules() -> None:
    for name in ("prometheus.yml", "kubernetes.yml"):
        text = (PROMETHEUS_DIR / name).read_text()
        assert "rule_files:\n  - alerts.yml\n" in text, name
