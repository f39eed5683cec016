"""The shipped local scrape config (deploy/prometheus/prometheus.yml), with Debian's Prometheus.

``promtool check config`` accepts the file as shipped; then a real
Prometheus, loading the mgmt-api job of that file with only its target, its
password file and the interval changed, scrapes a real mgmt-api: the target
turns ``up`` (it was a 401 before the job carried credentials) and its
samples are queryable.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.mgmt_api.harness import ADMIN_PASSWORD, MgmtServer
from tests.support.processes import wait_until

from .prometheus import Prometheus

SHIPPED = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "prometheus.yml"
MGMT_JOB = "meshplane-local-mgmt-api"

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="Debian's prometheus package (scripts/setup installs it)",
)


def test_promtool_accepts_the_shipped_config() -> None:
    done = subprocess.run(
        ["promtool", "check", "config", str(SHIPPED)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _mgmt_job_for(server: MgmtServer, password_file: Path) -> dict[str, Any]:
    """The shipped mgmt-api job, pointed at ``server``: same auth scheme and user."""
    shipped = yaml.safe_load(SHIPPED.read_text())
    (job,) = [j for j in shipped["scrape_configs"] if j["job_name"] == MGMT_JOB]
    job["basic_auth"]["password_file"] = str(password_file)
    job["static_configs"][0]["targets"] = [f"127.0.0.1:{server.port}"]
    job["scrape_interval"] = job["scrape_timeout"] = "2s"
    return dict(job)


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Prometheus]:
    server = MgmtServer().start()
    password_file = tmp_path / "admin-password"
    password_file.write_text(ADMIN_PASSWORD + "\n")
    running = Prometheus(tmp_path, [_mgmt_job_for(server, password_file)])
    try:
        yield running
    finally:
        running.close()
        server.close()


def test_prometheus_scrapes_mgmt_api_with_the_shipped_credentials(prometheus: Prometheus) -> None:
    # A slow scrape on a loaded machine is retried; a 401 never turns up
    # (the last error of each target is in the failure message).
    prometheus.wait_targets_up({MGMT_JOB}, timeout=90)

    def samples() -> list[Any] | None:
        return prometheus.query(f'up{{job="{MGMT_JOB}"}}') or None

    (series,) = wait_until(samples, timeout=30, what="mgmt-api's up sample")
    assert series["value"][1] == "1"
