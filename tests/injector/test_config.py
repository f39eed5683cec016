"""The injector's configuration file: the interface's example loads, and each wrong value
fails with the file, line and field (the operator reads the pod's log, nothing else)."""

from __future__ import annotations

from pathlib import Path

import pytest

from injector.config import load, read_ca
from meshplane.config_error import ConfigError
from tests.injector.support import write_config
from tests.support.certs import CertificateAuthority


def test_the_interface_example_loads(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    config = load(write_config(tmp_path / "c.yaml", ca.path))
    assert config.cluster_ref == "acme/east"
    assert config.sidecar.admin_port == 15000
    assert config.sidecar.resources["limits"] == {"cpu": "1", "memory": "256Mi"}
    assert "kube-node-lease" in config.system_namespaces
    assert config.opt_out_label == "sidecar.meshplane.io/inject"
    assert read_ca(config) == ca.path.read_text()


@pytest.mark.parametrize(
    ("text", "field", "line", "words"),
    [
        ("controlPlane: grpc://a:1\nsidecar: {image: x}\n", "cluster", None, "non-empty"),
        (
            "cluster: acme\ncontrolPlane: grpc://a:1\nsidecar: {image: x}\n",
            "cluster",
            1,
            "ORGANIZATION",
        ),
        (
            "cluster: a/b\ncontrolPlane: http://a:1\nsidecar: {image: x}\n",
            "controlPlane",
            2,
            "grpc",
        ),
        (
            "cluster: a/b\ncontrolPlane: grpcs://a:1\nsidecar: {image: x}\n",
            "controlPlane",
            2,
            "CaFile",
        ),
        ("cluster: a/b\ncontrolPlane: grpc://a:1\n", "sidecar", None, "required"),
        (
            "cluster: a/b\ncontrolPlane: grpc://a:1\nsidecar:\n  image: x\n  adminPort: 70000\n",
            "sidecar.adminPort",
            5,
            "port",
        ),
        (
            "cluster: a/b\ncontrolPlane: grpc://a:1\nsidecar: {image: x}\nextra: 1\n",
            "extra",
            4,
            "unknown",
        ),
        (
            "cluster: a/b\ncontrolPlane: grpc://a:1\nsidecar: {image: x}\n"
            "systemNamespaces: kube-system\n",
            "systemNamespaces",
            4,
            "list",
        ),
    ],
)
def test_wrong_values_name_file_line_and_field(
    tmp_path: Path, text: str, field: str, line: int | None, words: str
) -> None:
    path = tmp_path / "injector.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load(path)
    assert caught.value.field == field
    assert caught.value.source == str(path)
    if line is not None:
        assert caught.value.line == line
    assert words in str(caught.value)
