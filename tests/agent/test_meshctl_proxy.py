"""``meshctl proxy`` as a user runs it (a subprocess), against the fleet's real proxies."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from tests.agent.fleet import ORG, Fleet
from tests.meshctl.conftest import Meshctl
from tests.mgmt_api.harness import ADMIN_PASSWORD
from tests.support.processes import wait_until


def _meshctl(fleet: Fleet, tmp_path: Path) -> Meshctl:
    ctl = Meshctl(tmp_path / "home", fleet.mgmt.url)
    ctl.ok(
        "login", "--server", fleet.mgmt.url, "--username", "admin", "--password-stdin",
        input=ADMIN_PASSWORD + "\n",
    )  # fmt: skip
    return ctl


def test_stats_config_dump_and_loggers(fleet: Fleet, tmp_path: Path) -> None:
    ctl = _meshctl(fleet, tmp_path)
    where = ("-n", "shop", "--cluster", "a", "--org", ORG)
    stats = json.loads(ctl.ok("proxy", "stats", "web", *where, "--filter", r"^server\.live$"))
    assert [i["stats"] for i in stats["instances"]] == [[{"name": "server.live", "value": 1}]] * 2
    upstream = json.loads(ctl.ok("proxy", "stats", "api", *where, "--upstream"))
    assert upstream["instances"][0]["clusterStats"]["cluster_statuses"][0]["name"] == "backend"
    dump = ctl.ok("proxy", "config-dump", "api", *where, "--resource", "static_clusters")
    assert "hunter2" not in dump and json.loads(dump)["instances"][0]["configDump"]
    levels = ctl.ok("proxy", "loggers", "web", *where, "--instance", "web-2", "--set", "misc=debug")
    assert json.loads(levels)["instances"][0]["levels"]["misc"] == "debug"
    assert "  misc: debug" in fleet.envoys["web-2"].admin("POST", "/logging").text
    ctl.ok("proxy", "loggers", "web", *where, "--instance", "web-2", "--set", "info")
    error = ctl.fails(1, "proxy", "loggers", "web", *where, "--set", "loud")
    assert "level" in error


def test_logs_follow(fleet: Fleet, tmp_path: Path) -> None:
    ctl = _meshctl(fleet, tmp_path)
    envoy = fleet.envoys["web-1"]
    envoy.admin("POST", "/logging?admin=debug")
    marker = f"meshctl-{uuid.uuid4().hex}"
    where = ("-n", "shop", "--cluster", "a", "--org", ORG, "--instance", "web-1")
    proc = ctl.popen("proxy", "logs", "web", *where, "-f", "--tail", "0")
    try:
        active = 'meshplane_agent_active_calls{operation="stream_logs"}'
        wait_until(lambda: fleet.agent.metric(active) >= 1, timeout=30, what="the stream")
        envoy.admin("GET", f"/ready?{marker}")
        assert proc.stdout is not None
        for line in proc.stdout:
            if marker in line:
                assert line.startswith("web-1: ")
                break
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        envoy.admin("POST", "/logging?admin=info")
