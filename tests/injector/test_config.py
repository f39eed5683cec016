"""The injector's configuration file: the interface's example loads, and each wrong value
fails with the file, line and field (the operator reads the pod's log, nothing else)."""

from __future__ import annotations

import subprocess
import sys
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
    assert config.sidecar.resources["limits"] == {"cpu": "1", "memory": "256Mi"}
    assert "kube-node-lease" in config.system_namespaces
    assert config.opt_out_label == "sidecar.meshplane.io/inject"
    assert read_ca(config) == ca.path.read_text()


@pytest.mark.parametrize(
    ("text", "field", "line", "words"),
    [
        ("controlPlane: grpc://a:1\nsidecar: {image: x}\n", "cluster", None, "is required"),
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
            "unknown",
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
        (
            "cluster: a/b\ncontrolPlane: grpc://a:1\nsidecar: {image: x}\n"
            "diagnosticsCaller: meshplane-agent\n",
            "diagnosticsCaller",
            4,
            "NAMESPACE/SERVICEACCOUNT",
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


def test_serve_with_a_wrong_config_exits_2_naming_file_line_and_field(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    server = ca.issue("injector")
    path = tmp_path / "injector.yaml"
    path.write_text("cluster: a/b\ncontrolPlane: grpc://a:1\nsidecar:\n  resources: {}\n")
    args = ["--tls-cert", str(server.cert), "--tls-key", str(server.key), "--config", str(path)]
    done = subprocess.run(
        [sys.executable, "-m", "injector", "serve", "--listen", "127.0.0.1:0", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    # An absent key is located where its mapping starts: the place to add it.
    assert f"{path}:4: sidecar.image: is required" in done.stderr


def test_serve_with_an_unreadable_certificate_exits_2(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    config = write_config(tmp_path / "injector.yaml", ca.path)
    missing = tmp_path / "missing.crt"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "injector",
            "serve",
            "--tls-cert",
            str(missing),
            "--tls-key",
            str(missing),
            "--client-ca",
            str(ca.path),
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "missing.crt" in done.stderr


@pytest.mark.parametrize(
    ("client_args", "named"),
    [
        ([], "--client-ca: the API server's client CA is required"),
        (
            ["--client-name", "kube-apiserver"],
            "--client-ca: the API server's client CA is required",
        ),
        (["--insecure-no-client-auth", "--client-ca", "CA"], "--insecure-no-client-auth"),
    ],
    ids=["no-client-ca", "a-name-without-a-ca", "insecure-and-a-ca"],
)
def test_serve_without_the_api_servers_client_ca_exits_2(
    tmp_path: Path, client_args: list[str], named: str
) -> None:
    ca = CertificateAuthority(tmp_path)
    config = write_config(tmp_path / "injector.yaml", ca.path)
    issued = ca.issue("injector")
    args = [str(ca.path) if a == "CA" else a for a in client_args]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "injector",
            "serve",
            "--tls-cert",
            str(issued.cert),
            "--tls-key",
            str(issued.key),
            "--config",
            str(config),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert named in done.stderr
