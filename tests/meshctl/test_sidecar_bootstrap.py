"""``meshctl sidecar bootstrap``: a VM's sidecar, rendered offline, with no secret in it.

By default it prints the sidecar agent's command line (what a VM's service
unit runs); ``--format yaml`` prints the Envoy bootstrap the agent writes:
ADS and SDS over pipes to the agent, admin on a pipe, no bearer token, and
real Envoy accepts it. The printed command line, run with ``--print-bootstrap``
and a workload token, renders that same bootstrap.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

from meshplane import gateway_contract, workload_contract
from tests.support.envoy import validate
from tests.support.workload_tokens import PodRef, TestIssuer

USAGE = 2


def meshctl(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    return subprocess.run(
        [sys.executable, "-m", "meshctl", "sidecar", "bootstrap", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def args(tmp_path: Path) -> list[str]:
    return [
        "--cluster", "acme/east", "--ads", "grpcs://mgmt.example:8444",
        "--namespace", "billing", "--service-account", "payments", "--service", "payments",
        "--app-port", "8080", "--node-id", "vm-1", "--inbound", "10.0.0.7:15006",
        "--socket-dir", str(tmp_path / "s"), "--token-file", str(tmp_path / "token"),
        "--ca", "/etc/meshplane/ca.pem",
    ]  # fmt: skip


def test_the_bootstrap_has_pipes_and_no_token_and_envoy_accepts_it(tmp_path: Path) -> None:
    done = meshctl(tmp_path, *args(tmp_path), "--format", "yaml")
    assert done.returncode == 0, done.stderr
    doc = yaml.safe_load(done.stdout)
    assert "Bearer" not in done.stdout and "initial_metadata" not in done.stdout
    assert doc["admin"]["address"] == {"pipe": {"path": str(tmp_path / "s" / "admin.sock")}}
    clusters = {c["name"] for c in doc["static_resources"]["clusters"]}
    assert clusters == {gateway_contract.XDS_CLUSTER, workload_contract.SDS_CLUSTER}
    assert validate(doc).returncode == 0


def test_the_printed_command_renders_the_same_bootstrap(tmp_path: Path) -> None:
    done = meshctl(tmp_path, *args(tmp_path))
    assert done.returncode == 0, done.stderr
    argv = shlex.split(done.stdout)
    assert argv[0] == "meshplane-sidecar-agent"
    assert argv[argv.index("--control-plane-ca") + 1] == "/etc/meshplane/ca.pem"
    TestIssuer().write(tmp_path / "token", PodRef("billing", "vm-1", "payments"))
    # Rendered by the agent itself (plaintext here: the CA file is the VM's, not ours).
    plain = [a.replace("grpcs://", "grpc://") for a in shlex.split(done.stdout)]
    i = plain.index("--control-plane-ca")
    del plain[i : i + 2]
    rendered = subprocess.run(
        [sys.executable, "-m", "sidecar_agent", *plain[1:], "--print-bootstrap"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    expected = meshctl(tmp_path, *args(tmp_path), "--format", "yaml").stdout
    assert yaml.safe_load(rendered.stdout) == yaml.safe_load(expected)


def test_bad_flags_are_one_error_line(tmp_path: Path) -> None:
    bad = args(tmp_path)
    bad[bad.index("--ads") + 1] = "http://x:1"
    done = meshctl(tmp_path, *bad)
    assert done.returncode == USAGE and not done.stdout
    assert "--ads" in done.stderr
