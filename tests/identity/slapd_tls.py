"""A throwaway slapd that speaks StartTLS and ldaps, with a test CA made on the fly.

Built on ``tests.support.slapd`` (same schema, accounts and seeding); it adds
the TLS directives and an ``ldaps://`` listener. The server certificate is
for the IP address 127.0.0.1, signed by a CA that exists only in the test's
temp directory, so a client that verifies certificates accepts it only
when given that CA, and one that connects by another name must refuse it.
"""

from __future__ import annotations

import datetime
import ipaddress
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.support.net import free_port, wait_for_port
from tests.support.slapd import Slapd, _config, _seed_skeleton, find_slapd


@dataclass
class TlsSlapd:
    plain: Slapd
    ldaps_port: int
    ca_file: Path
    other_ca_file: Path
    """A CA that did not sign the server certificate."""

    @property
    def start_tls_url(self) -> str:
        return self.plain.url

    @property
    def ldaps_url(self) -> str:
        return f"ldaps://127.0.0.1:{self.ldaps_port}"

    def stop(self) -> None:
        self.plain.stop()


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _ca(directory: Path, stem: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(f"meshplane test {stem}"))
        .issuer_name(_name(f"meshplane test {stem}"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    (directory / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert


def _server_cert(directory: Path, ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    (directory / "server.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "server.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )


def start_tls_slapd(tmp: Path) -> TlsSlapd:
    """slapd with TLS on ``ldap://`` (StartTLS) and on ``ldaps://``; the caller stops it."""
    binary = find_slapd()
    workdir = tmp / "slapd-tls"
    (workdir / "data").mkdir(parents=True)
    ca_key, ca = _ca(workdir, "ca")
    _ca(workdir, "other-ca")
    _server_cert(workdir, ca_key, ca)
    tls = (
        f"TLSCACertificateFile {workdir / 'ca.pem'}\n"
        f"TLSCertificateFile {workdir / 'server.pem'}\n"
        f"TLSCertificateKeyFile {workdir / 'server.key'}\n"
    )
    conf = workdir / "slapd.conf"
    conf.write_text(_config(workdir).replace("database mdb", tls + "database mdb", 1))
    port, ldaps_port = free_port(), free_port()
    urls = f"ldap://127.0.0.1:{port}/ ldaps://127.0.0.1:{ldaps_port}/"
    with (workdir / "slapd.log").open("wb") as log:
        process = subprocess.Popen(
            [binary, "-f", str(conf), "-h", urls, "-d", "0"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server = Slapd(port=port, workdir=workdir, process=process)
    try:
        deadline = time.monotonic() + 15
        while True:
            if process.poll() is not None:
                output = (workdir / "slapd.log").read_text(errors="replace")[-2000:]
                raise AssertionError(f"slapd exited with {process.returncode}:\n{output}")
            try:
                wait_for_port(port, timeout=0.5)
                wait_for_port(ldaps_port, timeout=0.5)
                break
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise
        _seed_skeleton(server)
    except BaseException:
        server.stop()
        raise
    return TlsSlapd(server, ldaps_port, workdir / "ca.pem", workdir / "other-ca.pem")
