"""mgmt-api serves HTTPS itself: certificate flags, reload on change, optional mTLS.

A real ``mgmt-api serve`` subprocess with a throw-away PKI; every check is a
real TLS handshake on a loopback socket. The files are replaced the way a
secret mount or cert-manager does (write a new file, rename it over the old).
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography import x509

from tests.mgmt_api.harness import MgmtServer, ok
from tests.support.certs import CertificateAuthority, Issued
from tests.support.processes import wait_until


def _served_serial(port: int, ca: Path) -> int:
    """The serial number of the certificate a fresh handshake gets."""
    context = ssl.create_default_context(cafile=str(ca))
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # after a rotation the new CA is another one
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def _replace(target: Path, source: Path) -> None:
    """Atomically put ``source``'s content at ``target`` (new inode, as a secret mount does)."""
    tmp = target.with_suffix(".tmp")
    shutil.copyfile(source, tmp)
    os.replace(tmp, target)


class RestTlsFiles:
    """The REST port's certificate and key files, issued by a CA of their own."""

    def __init__(self, tmp: Path) -> None:
        self.ca = CertificateAuthority(tmp)
        first = self.ca.issue("mgmt")
        self.cert, self.key = tmp / "tls.crt", tmp / "tls.key"
        shutil.copyfile(first.cert, self.cert)
        shutil.copyfile(first.key, self.key)

    def args(self) -> tuple[str, ...]:
        return ("--tls-cert", str(self.cert), "--tls-key", str(self.key))


@pytest.fixture(scope="module")
def https(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MgmtServer, RestTlsFiles]]:
    tmp = tmp_path_factory.mktemp("https")
    files = RestTlsFiles(tmp)
    server = MgmtServer(
        extra_args=files.args(), tls_verify=_client_context(files.ca.path, None)
    ).start()
    try:
        yield server, files
    finally:
        server.close()


def test_the_rest_port_speaks_https_with_the_given_certificate(
    https: tuple[MgmtServer, RestTlsFiles],
) -> None:
    server, _ = https
    assert server.url.startswith("https://")
    with server.admin() as admin:
        assert ok(admin.get("/v2/organizations"))["organizations"] is not None
    # Plain HTTP on the same port is not answered as HTTP.
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{server.port}/readyz", timeout=5)


def test_a_replaced_certificate_is_served_without_a_restart(
    https: tuple[MgmtServer, RestTlsFiles], tmp_path: Path
) -> None:
    server, files = https
    before = _served_serial(server.port, files.ca.path)
    rotated = CertificateAuthority(tmp_path, "rotated CA").issue("mgmt")
    # The key first, then the certificate: in between the pair does not
    # match, and the server must keep serving the old one.
    _replace(files.key, rotated.key)

    def refused_the_mismatch() -> bool:
        _served_serial(server.port, files.ca.path)  # a handshake makes it look at the files
        return "do not load" in server.log_path.read_text()

    wait_until(refused_the_mismatch, 30, "the server to notice the mismatched pair")
    assert _served_serial(server.port, files.ca.path) == before
    _replace(files.cert, rotated.cert)
    serial = x509.load_pem_x509_certificate(rotated.cert.read_bytes()).serial_number
    wait_until(
        lambda: _served_serial(server.port, files.ca.path) == serial, 30, "the new certificate"
    )
    with httpx.Client(
        verify=_client_context(tmp_path / "rotated-CA.crt", None), timeout=30
    ) as client:
        assert client.get(server.url + "/readyz").status_code == 200
    # Back to a pair signed by the first CA, so the module's other tests see it.
    original = files.ca.issue("mgmt-again")
    _replace(files.key, original.key)
    _replace(files.cert, original.cert)
    wait_until(
        lambda: (
            _served_serial(server.port, files.ca.path)
            == x509.load_pem_x509_certificate(original.cert.read_bytes()).serial_number
        ),
        30,
        "the first CA's certificate again",
    )


def _client_context(ca: Path, client: Issued | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        context.load_cert_chain(str(client.cert), str(client.key))
    return context


def test_with_a_client_ca_clients_need_a_certificate(tmp_path: Path) -> None:
    files = RestTlsFiles(tmp_path)
    clients = CertificateAuthority(tmp_path, "client CA")
    good = clients.issue("console-user", client=True)
    stranger = CertificateAuthority(tmp_path, "other CA").issue("stranger", client=True)
    server = MgmtServer(
        extra_args=(*files.args(), "--tls-client-ca", str(clients.path)),
        tls_verify=_client_context(files.ca.path, good),
    ).start()
    try:
        with server.admin() as admin:
            assert admin.get("/readyz").status_code == 200
        for who in (None, stranger):
            with (
                httpx.Client(verify=_client_context(files.ca.path, who), timeout=10) as client,
                pytest.raises(httpx.HTTPError),
            ):
                client.get(server.url + "/readyz")
    finally:
        server.close()


def test_a_key_without_a_certificate_stops_the_start(tmp_path: Path) -> None:
    files = RestTlsFiles(tmp_path)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "mgmt_api.cli", "serve", "--listen", "127.0.0.1:0"),
            *("--grpc-listen", "off", "--database", f"sqlite+pysqlite:///{tmp_path / 'db'}"),
            *("--tls-key", str(files.key)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "give both MESHPLANE_TLS_CERT and MESHPLANE_TLS_KEY" in done.stderr
