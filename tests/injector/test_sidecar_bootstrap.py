"""The injected sidecar's own start: the container the webhook adds, run as the kubelet would
run it (no Kubernetes here: the downward-API variables are set from test values and the
Secret and emptyDir mounts are test directories substituted for their mount paths).

- its rendered bootstrap passes the real ``envoy --mode validate``, with the pod's name as
  node id, the cluster, and the namespace/service account/app in the node metadata;
- run for real, Envoy starts on it, is hot-restarted on a fresh bootstrap when the
  token's renewal time comes (shortened here with the hidden ``--renew-after``), and
  SIGTERM stops everything with exit code 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
import yaml

from injector import shape
from injector.config import parse
from injector.decision import PodFacts
from injector.patch import operations
from meshplane import gateway_contract
from meshplane import sidecar_contract as sc
from meshplane.yamlconf import load_yaml
from tests.injector.support import apply_patch, credentials, pod, write_config
from tests.support.certs import CertificateAuthority
from tests.support.envoy import validate
from tests.support.net import free_port
from tests.support.processes import terminate, wait_until

POD_NAME = "cart-7d4f9c-x2x9q"


def sidecar_container(tmp: Path, control_plane: str) -> dict[str, Any]:
    """The container the patch adds to :func:`pod`, as the API server would store it."""
    ca = CertificateAuthority(tmp)
    config = parse(load_yaml(write_config(tmp / "injector.yaml", ca.path, control_plane)))
    obj = pod()
    facts = PodFacts("shop", obj["metadata"]["labels"], {}, ["app"])
    patched = apply_patch(obj, operations(obj, facts, config, ca.path.read_text()))
    container: dict[str, Any] = patched["spec"]["containers"][-1]
    return container


def command(
    container: dict[str, Any], tmp: Path, admin_port: int
) -> tuple[list[str], dict[str, str]]:
    """The container's command and environment on this host: mounts substituted."""
    secret, bootstrap = tmp / "secret", tmp / "bootstrap"
    secret.mkdir()
    bootstrap.mkdir()
    credentials(secret / "credentials.json")
    mounts = {shape.CREDENTIALS_DIR: str(secret), shape.BOOTSTRAP_DIR: str(bootstrap)}
    args = [mounts.get(a, a) for a in container["args"]]
    args[args.index("--admin-port") + 1] = str(admin_port)
    assert container["command"] == ["meshplane-injector", "sidecar"]
    downward = {
        "metadata.name": POD_NAME,
        "metadata.namespace": "shop",
        "spec.serviceAccountName": "cart",
        "status.podIP": "10.1.2.3",
    }
    env = dict(os.environ)
    for variable in container["env"]:
        if "value" in variable:
            env[variable["name"]] = variable["value"]
        else:
            env[variable["name"]] = downward[variable["valueFrom"]["fieldRef"]["fieldPath"]]
    return [sys.executable, "-m", "injector", "sidecar", *args], env


@pytest.mark.parametrize(
    "control_plane", ["grpcs://mgmt-api-grpc.meshplane:8444", "grpc://10.0.0.7:8443"]
)
def test_rendered_bootstrap_of_an_injected_sidecar_passes_envoy_validate(
    tmp_path: Path, control_plane: str
) -> None:
    container = sidecar_container(tmp_path, control_plane)
    argv, env = command(container, tmp_path, 15000)
    done = subprocess.run(
        [*argv, "--render-only"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip())
    assert path.stat().st_mode & 0o777 == 0o600  # it holds a token
    doc = yaml.safe_load(path.read_text())
    node = doc["node"]
    assert node["id"] == POD_NAME
    assert node["cluster"] == "acme/east"
    # A sidecar node, as mgmt-api's ADS parses it: the app's port from the pod
    # spec, inbound on the pod IP, outbound on loopback.
    parsed = sc.parse_node(node["id"], node["cluster"], node["metadata"])
    assert parsed == sc.SidecarNode(
        "acme",
        "east",
        POD_NAME,
        "shop",
        "cart",
        "cart",
        8080,
        inbound_host="10.1.2.3",
        inbound_port=shape.LISTEN_PORT,
        outbound_port=shape.OUTBOUND_PORT,
    )
    header = doc["dynamic_resources"]["ads_config"]["grpc_services"][0]["initial_metadata"][0]
    token = header["value"].removeprefix("Bearer ")
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["aud"] == gateway_contract.XDS_AUDIENCE
    assert claims["exp"] - claims["iat"] == gateway_contract.GATEWAY_TOKEN_TTL_SECONDS
    result = validate(path)
    assert result.returncode == 0, result.stderr[-3000:]


def _server_info(port: int) -> dict[str, Any] | None:
    try:
        answer = httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=5)
    except httpx.HTTPError:
        return None
    info: dict[str, Any] = answer.json()
    return info if answer.status_code == 200 else None


@pytest.mark.timeout(400)  # Envoy's first epoch initializes in ~30 s with no ADS server
def test_sidecar_runs_envoy_hot_restarts_it_on_a_fresh_token_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    container = sidecar_container(tmp_path, "grpc://127.0.0.1:9")
    admin = free_port()
    argv, env = command(container, tmp_path, admin)
    log = (tmp_path / "sidecar.log").open("wb")
    proc = subprocess.Popen([*argv, "--renew-after", "3"], env=env, stdout=log, stderr=log)
    try:
        first = wait_until(lambda: _server_info(admin), timeout=60, what="envoy's admin")
        assert first["node"]["id"] == POD_NAME
        assert first["command_line_options"]["restart_epoch"] == 0
        token = (tmp_path / "bootstrap" / "envoy.yaml").read_text()
        renewed = wait_until(
            lambda: (
                (i := _server_info(admin)) and i["command_line_options"]["restart_epoch"] >= 1 and i
            ),
            timeout=180,  # Envoy refuses a hot restart until its first epoch initialized
            what="the hot restart on a fresh bootstrap",
        )
        assert renewed["node"]["id"] == POD_NAME
        assert (tmp_path / "bootstrap" / "envoy.yaml").read_text() != token
    finally:
        code = terminate(proc, grace=60)
        log.close()
    assert code == 0, (tmp_path / "sidecar.log").read_text()[-3000:]
    assert _server_info(admin) is None
