"""``meshctl gateway bootstrap``: the file a gateway Envoy starts from, rendered offline.

The output must be a bootstrap real Envoy accepts (``envoy --mode validate``),
name the node the way the ADS server parses it, and carry a token signed
with the cluster's key for the xDS audience; ``-o`` writes it mode 0600; bad
flags are one ``error:`` line with exit code 2 and no output.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import jwt
import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm

from meshplane import gateway_contract
from tests.support.certs import CertificateAuthority
from tests.support.envoy import validate

USAGE = 2


@pytest.fixture
def key(tmp_path: Path) -> tuple[Path, ec.EllipticCurvePrivateKey]:
    """A cluster credentials file in the install template's shape, and its key."""
    private = ec.generate_private_key(ec.SECP256R1())
    jwk = ECAlgorithm.to_jwk(private, as_dict=True) | {"kid": "gw-test"}
    path = tmp_path / "demo.json"
    path.write_text(
        json.dumps(
            {
                "clusterFqn": "organizations/acme/clusters/east",
                "serviceAccountFqn": "organizations/acme/clusters/east/serviceaccounts/agent",
                "jwk": json.dumps(jwk),
            }
        )
    )
    return path, private


def meshctl(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    return subprocess.run(
        [sys.executable, "-m", "meshctl", "gateway", "bootstrap", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def base_args(credentials: Path) -> list[str]:
    return ["--cluster", "acme/east", "--credentials", str(credentials)]


def token_of(doc: dict[str, Any]) -> str:
    service = doc["dynamic_resources"]["ads_config"]["grpc_services"][0]
    header = service["initial_metadata"][0]
    assert header["key"] == "authorization"
    value: str = header["value"]
    assert value.startswith("Bearer ")
    return value.removeprefix("Bearer ")


def test_stdout_yaml_is_a_bootstrap_envoy_accepts(
    tmp_path: Path, key: tuple[Path, ec.EllipticCurvePrivateKey]
) -> None:
    credentials, private = key
    done = meshctl(
        tmp_path,
        *base_args(credentials),
        "--ads",
        "grpc://10.0.0.5:8444",
        "--node-id",
        "gw-1",
        "--listen",
        "127.0.0.1:18080",
        "--gateway-name",
        "edge",
        "--ratelimit-service",
        "grpc://ratelimit.mesh:8081",
        "--admin",
        "127.0.0.1:19901",
    )
    assert done.returncode == 0, done.stderr
    assert "keep it secret" in done.stderr
    doc = yaml.safe_load(done.stdout)
    assert "&id" not in done.stdout  # no YAML anchors: the file is read by people too
    node = gateway_contract.parse_node(
        doc["node"]["id"], doc["node"]["cluster"], doc["node"]["metadata"]
    )
    assert node == gateway_contract.GatewayNode(
        "acme", "east", "gw-1", "127.0.0.1", 18080, "edge", "grpc://ratelimit.mesh:8081"
    )
    assert doc["admin"]["address"]["socket_address"] == {
        "address": "127.0.0.1",
        "port_value": 19901,
    }
    claims = jwt.decode(
        token_of(doc),
        private.public_key(),
        algorithms=["ES256"],
        audience=gateway_contract.XDS_AUDIENCE,
    )
    assert claims["exp"] - claims["iat"] == gateway_contract.GATEWAY_TOKEN_TTL_SECONDS
    assert jwt.get_unverified_header(token_of(doc))["kid"] == "gw-test"
    checked = validate(done.stdout)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_output_file_is_json_mode_0600_and_validates_with_mutual_tls(
    tmp_path: Path, key: tuple[Path, ec.EllipticCurvePrivateKey]
) -> None:
    credentials, _ = key
    ca = CertificateAuthority(tmp_path)
    client = ca.issue("gw-1", client=True)
    out = tmp_path / "envoy.json"
    out.write_text("old")
    out.chmod(0o644)  # an existing file with wider permissions is narrowed
    done = meshctl(
        tmp_path,
        *base_args(credentials),
        "--ads",
        "grpcs://mgmt.example.com:8444",
        "--ca",
        str(ca.path),
        "--cert",
        str(client.cert),
        "--key",
        str(client.key),
        "-o",
        str(out),
        "--format",
        "json",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    doc = json.loads(out.read_text())
    (xds,) = doc["static_resources"]["clusters"]
    assert xds["type"] == "STRICT_DNS"
    tls = xds["transport_socket"]["typed_config"]
    assert tls["sni"] == "mgmt.example.com"
    assert tls["common_tls_context"]["validation_context"]["trusted_ca"]["filename"] == str(ca.path)
    checked = validate(out)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cluster", "acme", "--ads", "grpc://h:1"], "--cluster must be ORGANIZATION/CLUSTER"),
        (["--ads", "http://mgmt:8444"], "--ads must be grpc://HOST:PORT or grpcs://HOST:PORT"),
        (["--ads", "grpc://mgmt"], "--ads must be grpc://HOST:PORT"),
        (["--ads", "grpcs://mgmt:8444"], "needs the CA file"),
        (["--ads", "grpc://mgmt:8444", "--ca", "ca.pem"], "go with a grpcs:// --ads address"),
        (
            ["--ads", "grpcs://mgmt:8444", "--ca", "ca.pem", "--cert", "c.pem"],
            "needs both the certificate and the key",
        ),
        (["--ads", "grpc://m:1", "--listen", "gateway:80"], "the --listen host must be an IP"),
        (["--ads", "grpc://m:1", "--listen", "10000"], "--listen must be HOST:PORT"),
        (["--ads", "grpc://m:1", "--admin", "127.0.0.1:0"], "--admin needs a port 1-65535"),
        (["--ads", "grpc://m:1", "--ratelimit-service", "ratelimit:8081"], "--ratelimit-service"),
        (["--ads", "grpc://m:1", "--format", "xml"], "--format must be yaml or json"),
        (
            ["--ads", "grpc://m:1", "--cluster", "acme/west"],
            "not of organizations/acme/clusters/west",
        ),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(
    tmp_path: Path,
    key: tuple[Path, ec.EllipticCurvePrivateKey],
    args: list[str],
    message: str,
) -> None:
    credentials, _ = key
    done = meshctl(tmp_path, *base_args(credentials), *args)
    assert done.returncode == USAGE, done
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert message in lines[0], lines[0]


def test_unreadable_or_wrong_credentials(tmp_path: Path) -> None:
    missing = meshctl(tmp_path, *base_args(tmp_path / "nope.json"), "--ads", "grpc://m:1")
    assert missing.returncode == USAGE
    assert "error: --credentials:" in missing.stderr and "cannot read" in missing.stderr
    public_only = tmp_path / "public.json"
    public_only.write_text(json.dumps({"kty": "EC", "crv": "P-256", "x": "a", "y": "b"}))
    done = meshctl(tmp_path, *base_args(public_only), "--ads", "grpc://m:1")
    assert done.returncode == USAGE
    assert "private EC JWK" in done.stderr
