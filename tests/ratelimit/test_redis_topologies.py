"""Redis access beyond plain TCP: ACL user + password, TLS, and Sentinel, each
against a real redis-server; and no secret in the logs."""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ratelimit.settings import Settings
from tests.ratelimit.conftest import OK, OVER, request, serve_app, write_config
from tests.support.net import free_port
from tests.support.redis_server import RedisSentinel, RedisServer

CONFIG = """\
domain: topo
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 2}
"""
SECRET = "s3cr@t-pa55"


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return write_config(tmp_path, "topo.yaml", CONFIG)


async def exhaust(svc_url: str, config: Path) -> None:
    async with serve_app(config, redis_url=svc_url) as svc:
        codes = [
            (await svc.call(request("topo", [("client", "a")]))).overall_code for _ in range(3)
        ]
        assert codes == [OK, OK, OVER]


async def test_acl_user_and_password(config: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    server = RedisServer(
        extra_args=("--user", "default", "off", "--user", "rl", "on", f">{SECRET}", "~*", "+@all")
    ).start()
    try:
        await exhaust(f"redis://rl:s3cr%40t-pa55@127.0.0.1:{server.port}/0", config)
        bad = f"redis://rl:wrong-{SECRET}@127.0.0.1:{server.port}/0"
        async with serve_app(config, redis_url=bad, wait_ready=False) as svc:
            await svc.wait_serving(False)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await svc.call(request("topo", [("client", "a")]))
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        server.close()
    logged = "\n".join(r.getMessage() + repr(r.__dict__) for r in caplog.records)
    assert SECRET not in logged


def make_tls_files(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_path, cert_path, key_path = (
        directory / "ca.pem",
        directory / "cert.pem",
        directory / "key.pem",
    )
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return ca_path, cert_path, key_path


async def test_tls(config: Path, tmp_path: Path) -> None:
    ca, cert, key = make_tls_files(tmp_path)
    port = free_port()
    server = RedisServer(
        port,
        extra_args=(
            "--port", "0", "--tls-port", str(port), "--tls-cert-file", str(cert),
            "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no",
        ),
    ).start()  # fmt: skip
    try:
        await exhaust(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}", config)
        # Without our CA the server's certificate is not trusted: never ready.
        untrusted = f"rediss://127.0.0.1:{port}/0"
        settings = Settings(store_timeout=0.5)
        async with serve_app(
            config, redis_url=untrusted, settings=settings, wait_ready=False
        ) as svc:
            await svc.wait_serving(False)
    finally:
        server.close()


async def test_sentinel(config: Path) -> None:
    master = RedisServer().start()
    sentinel = RedisSentinel(master.port).start()
    try:
        await exhaust(f"redis+sentinel://127.0.0.1:{sentinel.port}/{sentinel.master_name}", config)
    finally:
        sentinel.close()
        master.close()
