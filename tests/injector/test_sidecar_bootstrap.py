"""The injected sidecar's own start: the container the webhook adds, run as the kubelet would
run it (no Kubernetes here: the downward-API variables are expanded from test values, the
projected token is a test issuer's JWT of the same claims, and the emptyDir is a test
directory substituted for its mount path).

What the container's command renders (``meshplane-sidecar-agent --print-bootstrap``):
the pod's name as node id, the cluster, the token's namespace and service account and the
app in the node metadata, ADS and SDS over pipes to the agent, admin on a pipe, no token,
and the real ``envoy --mode validate`` accepts it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from injector import shape
from injector.config import parse
from injector.decision import PodFacts
from injector.patch import operations
from meshplane import gateway_contract, workload_contract
from meshplane import sidecar_contract as sc
from meshplane.yamlconf import load_yaml
from tests.injector.support import apply_patch, pod, write_config
from tests.support.certs import CertificateAuthority
from tests.support.envoy import validate
from tests.support.workload_tokens import PodRef, TestIssuer

POD_NAME = "cart-7d4f9c-x2x9q"
CALLER = "meshplane/meshplane-cluster-agent"


def sidecar_container(tmp: Path, control_plane: str) -> dict[str, Any]:
    """The container the patch adds to :func:`pod`, as the API server would store it."""
    ca = CertificateAuthority(tmp)
    path = write_config(tmp / "injector.yaml", ca.path, control_plane)
    path.write_text(path.read_text() + f"diagnosticsCaller: {CALLER}\n")
    config = parse(load_yaml(path))
    obj = pod()
    facts = PodFacts("shop", obj["metadata"]["labels"], {}, ["app"])
    patched = apply_patch(obj, operations(obj, facts, config, ca.path.read_text()))
    # Prometheus finds the metrics-only port by the pod's annotations.
    annotations = patched["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(shape.PROMETHEUS_PORT)
    assert annotations["prometheus.io/path"] == "/stats/prometheus"
    container: dict[str, Any] = patched["spec"]["containers"][-1]
    return container


def command(container: dict[str, Any], tmp: Path) -> tuple[list[str], dict[str, str]]:
    """The container's command and environment on this host: mounts substituted, the
    projected token minted by a test issuer, ``$(VAR)`` expanded as the kubelet does."""
    token_dir, sockets = tmp / "token", tmp / "s"
    token_dir.mkdir()
    TestIssuer().write(token_dir / "token", PodRef("shop", POD_NAME, "cart"))
    mounts = {
        str(shape.TOKEN_PATH): str(token_dir / "token"),
        str(shape.SOCKET_DIR): str(sockets),
    }
    downward = {"metadata.name": POD_NAME, "status.podIP": "10.1.2.3"}
    env = dict(os.environ)
    for variable in container["env"]:
        if "value" in variable:
            env[variable["name"]] = variable["value"]
        else:
            env[variable["name"]] = downward[variable["valueFrom"]["fieldRef"]["fieldPath"]]
    args = [
        re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], mounts.get(a, a))
        for a in container["args"]
    ]
    assert container["command"] == ["meshplane-sidecar-agent"]
    return [sys.executable, "-m", "sidecar_agent", *args], env


@pytest.mark.parametrize(
    "control_plane", ["grpcs://mgmt-api-grpc.meshplane:8444", "grpc://10.0.0.7:8443"]
)
def test_rendered_bootstrap_of_an_injected_sidecar_has_no_secret_and_passes_envoy_validate(
    tmp_path: Path, control_plane: str
) -> None:
    container = sidecar_container(tmp_path, control_plane)
    argv, env = command(container, tmp_path)
    done = subprocess.run(
        [*argv, "--print-bootstrap"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    doc = yaml.safe_load(done.stdout)
    node = doc["node"]
    assert node["id"] == POD_NAME
    assert node["cluster"] == "acme/east"
    # A sidecar node, as mgmt-api's ADS parses it: the token's namespace and account,
    # the app's port from the pod spec, inbound on the pod IP, outbound on loopback.
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
    sockets = tmp_path / "s"
    ads = doc["dynamic_resources"]["ads_config"]["grpc_services"]
    assert ads == [{"envoy_grpc": {"cluster_name": gateway_contract.XDS_CLUSTER}}]
    assert "initial_metadata" not in done.stdout and "Bearer" not in done.stdout
    pipes = {
        c["name"]: c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
        for c in doc["static_resources"]["clusters"]
    }
    assert pipes == {
        gateway_contract.XDS_CLUSTER: {"pipe": {"path": str(sockets / "xds.sock")}},
        workload_contract.SDS_CLUSTER: {"pipe": {"path": str(sockets / "sds.sock")}},
        sc.ADMIN_CLUSTER: {"pipe": {"path": str(sockets / "admin.sock")}},
    }
    # The admin API's two doors on the pod IP: mTLS diagnostics for the agent, metrics.
    listeners = {
        entry["name"]: entry["address"]["socket_address"]
        for entry in doc["static_resources"]["listeners"]
    }
    assert listeners == {
        "meshplane_diagnostics": {"address": "10.1.2.3", "port_value": shape.DIAGNOSTICS_PORT},
        "meshplane_prometheus": {"address": "10.1.2.3", "port_value": shape.PROMETHEUS_PORT},
    }
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["mesh-diag"] == shape.DIAGNOSTICS_PORT
    assert ports[shape.METRICS_PORT_NAME] == shape.PROMETHEUS_PORT
    (diagnostics,) = [
        entry for entry in doc["static_resources"]["listeners"]
        if entry["name"] == "meshplane_diagnostics"
    ]  # fmt: skip
    tls = diagnostics["filter_chains"][0]["transport_socket"]["typed_config"]
    validation = tls["common_tls_context"]["combined_validation_context"]
    (san,) = validation["default_validation_context"]["match_typed_subject_alt_names"]
    assert san["matcher"]["safe_regex"]["regex"] == sc.PodPorts(caller=CALLER).caller_san_regex()
    assert tls["require_client_certificate"] is True
    assert doc["admin"] == {"address": {"pipe": {"path": str(sockets / "admin.sock")}}}
    path = tmp_path / "envoy.yaml"
    path.write_text(done.stdout)
    result = validate(path)
    assert result.returncode == 0, result.stderr[-3000:]
