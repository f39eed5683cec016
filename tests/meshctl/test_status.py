"""``meshctl status`` against a real cluster: healthy (exit 0), a gateway NACKing (exit 7).

The stack (:mod:`tests.gateway.nacking`) is mgmt-api, ratelimit and extauthz
subscribed to it, and one real gateway Envoy on ADS that lacks the rate-limit
filter, so a rate limit on its route makes it NACK. meshctl runs as a
subprocess, logged in as the admin, exactly as in CI.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.gateway.nacking import REFUSED_FILTER, make_it_nack, stack_with_limited_gateway
from tests.meshctl.conftest import Meshctl
from tests.mgmt_api.harness import ADMIN_PASSWORD, ok
from tests.support.gateway import BASE, CLUSTER, ORG, GatewayStack

UNHEALTHY = 7
TARGET = f"{ORG}/{CLUSTER}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayStack]:
    with stack_with_limited_gateway(Path(tmp_path_factory.mktemp("meshctl-status"))) as st:
        yield st


@pytest.fixture(scope="module")
def ctl(tmp_path_factory: pytest.TempPathFactory, stack: GatewayStack) -> Meshctl:
    assert stack.mgmt is not None
    meshctl = Meshctl(tmp_path_factory.mktemp("status-home"), stack.mgmt.url)
    meshctl.ok(
        "login", "--server", stack.mgmt.url, "--username", "admin", "--password-stdin",
        input=ADMIN_PASSWORD + "\n",
    )  # fmt: skip
    return meshctl


def rows(table: str) -> dict[tuple[str, str], list[str]]:
    """(KIND, INSTANCE) -> the row's columns, split on the table's runs of spaces."""
    lines = table.splitlines()
    assert lines[0].split() == [
        "CLUSTER", "KIND", "INSTANCE", "STATE", "APPLIED", "WANTED", "LAST", "CONTACT", "ERROR",
    ]  # fmt: skip
    out = {}
    for line in lines[1:]:
        cells = [c for c in line.split("  ") if c.strip()]
        out[(cells[1].strip(), cells[2].strip())] = [c.strip() for c in cells]
    return out


def test_a_healthy_cluster_exits_0_with_every_instance_acked(
    ctl: Meshctl, stack: GatewayStack
) -> None:
    result = ctl.run("status", "--cluster", TARGET)
    assert result.returncode == 0, (result.stdout, result.stderr)
    table = rows(result.stdout)
    assert {kind for kind, _ in table} == {"gateway", "ratelimit", "extauthz"}
    gateway = table[("gateway", "limited")]
    assert gateway[0] == TARGET and gateway[3] == "ACK"
    assert gateway[4] == gateway[5]  # applied == wanted
    assert gateway[6].endswith("ago")
    # JSON for programs: the server's view, and the verdict.
    data = json.loads(ctl.ok("status", "--cluster", TARGET, "-o", "json"))
    assert data["healthy"] is True
    (cluster,) = data["clusters"]
    assert cluster["cluster"] == f"organizations/{ORG}/clusters/{CLUSTER}"
    assert all(i["lastContactTime"].endswith("Z") for i in cluster["instances"])


def test_a_nacking_gateway_exits_7_with_envoys_error(ctl: Meshctl, stack: GatewayStack) -> None:
    entry = make_it_nack(stack)
    result = ctl.run("status", "--cluster", TARGET)
    assert result.returncode == UNHEALTHY, (result.stdout, result.stderr)
    table = rows(result.stdout)
    gateway = table[("gateway", "limited")]
    assert gateway[3] == "NACK"
    assert gateway[4] == entry["appliedVersion"][:12]
    assert gateway[5] == entry["desired"][:12] != gateway[4]
    assert REFUSED_FILTER in gateway[7]
    # The services took the same change: only the gateway fails.
    assert {table[k][3] for k in table if k[0] != "gateway"} == {"ACK"}

    # --kind narrows what is judged: the ratelimit instances are healthy.
    only = ctl.run("status", "--cluster", TARGET, "--kind", "ratelimit")
    assert only.returncode == 0, (only.stdout, only.stderr)
    assert {kind for kind, _ in rows(only.stdout)} == {"ratelimit"}

    # YAML says the same, and so does every cluster of the organization (no --cluster).
    as_yaml = ctl.run("status", "--org", ORG, "-o", "yaml")
    assert as_yaml.returncode == UNHEALTHY, as_yaml.stderr
    data = yaml.safe_load(as_yaml.stdout)
    assert data["healthy"] is False
    nacks = [i for c in data["clusters"] for i in c["instances"] if i["lastResult"] == "NACK"]
    assert [(i["kind"], i["instance"]) for i in nacks] == [("gateway", "limited")]


def test_every_cluster_of_the_organization_and_a_cluster_without_instances(
    ctl: Meshctl, stack: GatewayStack
) -> None:
    ok(stack.admin.post(f"{BASE}/clusters", json={"name": "quiet", "cluster": {}}))
    quiet = ctl.run("status", "--cluster", f"{ORG}/quiet")
    assert quiet.returncode == 0, (quiet.stdout, quiet.stderr)
    assert quiet.stdout == "No instance has subscribed.\n"
    both = ctl.run("status", "--org", ORG)
    assert both.returncode == UNHEALTHY  # c1's gateway still NACKs
    assert {cells[0] for cells in rows(both.stdout).values()} == {TARGET}


def test_usage_errors_name_what_is_missing(ctl: Meshctl) -> None:
    assert "--kind must be one of gateway, sidecar, ratelimit, extauthz" in ctl.fails(
        2, "status", "--cluster", TARGET, "--kind", "proxy"
    )
    assert "--cluster must be ORG/CLUSTER" in ctl.fails(2, "status", "--cluster", "a/b/c")
    assert "needs --cluster ORG/CLUSTER" in ctl.fails(2, "status")
    assert "NOT_FOUND" in ctl.fails(4, "status", "--cluster", f"{ORG}/nope")
