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

import httpx
import pytest
import yaml

from tests.mgmt_api.harness import ADMIN_PASSWORD, MgmtServer
from tests.support.net import free_port
from tests.support.processes import terminate, wait_until

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
def prometheus(tmp_path: Path) -> Iterator[tuple[str, MgmtServer]]:
    server = MgmtServer().start()
    password_file = tmp_path / "admin-password"
    password_file.write_text(ADMIN_PASSWORD + "\n")
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"scrape_configs": [_mgmt_job_for(server, password_file)]}))
    port = free_port()
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "prometheus.log", "ab"),  # noqa: SIM115
    )
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        terminate(proc)
        server.close()


def test_prometheus_scrapes_mgmt_api_with_the_shipped_credentials(
    prometheus: tuple[str, MgmtServer],
) -> None:
    url, _server = prometheus

    seen: list[str] = []

    def scraped() -> bool:
        """The target is up; every other state seen is kept for the failure message
        (a slow scrape on a loaded machine is retried, a 401 never turns up)."""
        try:
            targets = httpx.get(f"{url}/api/v1/targets", timeout=5).json()["data"]
        except (httpx.HTTPError, ValueError, KeyError):
            return False
        found = [t for t in targets["activeTargets"] if t["labels"]["job"] == MGMT_JOB]
        if found and found[0]["health"] != "unknown":
            seen.append(f"{found[0]['health']}: {found[0]['lastError']}")
        return bool(found) and found[0]["health"] == "up"

    try:
        wait_until(scraped, timeout=90, what="mgmt-api's target up")
    except AssertionError:
        raise AssertionError(f"never up; seen: {sorted(set(seen))}") from None

    def samples() -> list[Any] | None:
        answer = httpx.get(
            f"{url}/api/v1/query", params={"query": f'up{{job="{MGMT_JOB}"}}'}, timeout=5
        ).json()
        return answer["data"]["result"] or None

    (series,) = wait_until(samples, timeout=30, what="mgmt-api's up sample")
    assert series["value"][1] == "1"
