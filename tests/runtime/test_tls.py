"""TLS and mutual TLS on the gRPC listener, on every server, through real handshakes.

With a server certificate, plaintext clients get nowhere; with a client CA
too, a client without a certificate (or with one from another CA) is refused
during the handshake, before any call. Certificates are replaced on disk the
way Kubernetes and cert-manager do it (new files renamed into place) and the
next connection uses them, without a restart.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.runtime.echo_app import SERVICE
from tests.runtime.supervisors import SERVERS, Supervisor
from tests.support.certs import CertificateAuthority, Issued
from tests.support.grpc_raw import raw_unary

SLEEP = f"/{SERVICE}/Sleep"


class Pki:
    """A CA, the server's files under ``serving/`` (what the server reads), a client."""

    def __init__(self, root: Path, name: str) -> None:
        (root / name).mkdir()
        self.ca = CertificateAuthority(root / name, name=f"{name} CA")
        self.server = self.ca.issue("server")
        self.client = self.ca.issue("client", client=True)


def _install(leaf: Issued, ca: Path, serving: Path) -> None:
    """Put a cert/key/CA set in place atomically, file by file (renames)."""
    for source, target in ((leaf.cert, "server.crt"), (leaf.key, "server.key"), (ca, "ca.crt")):
        staging = serving / f".{target}.new"
        shutil.copyfile(source, staging)
        os.replace(staging, serving / target)


def _call(port: int, ca: Path, client: Issued | None = None, timeout: float = 10) -> bytes:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(),
        private_key=client.key.read_bytes() if client else None,
        certificate_chain=client.cert.read_bytes() if client else None,
    )
    with grpc.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
        reply: bytes = raw_unary(channel, SLEEP)(b"1", timeout=timeout)
    return reply


def _handshake(port: int, ca: Path, client: Issued | None) -> str:
    """A raw TLS handshake (ALPN h2) and one read: "ok", or why it failed."""
    context = ssl.create_default_context(cafile=str(ca))
    context.set_alpn_protocols(["h2"])
    if client is not None:
        context.load_cert_chain(client.cert, client.key)
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname="localhost") as tls,
        ):
            # TLS 1.3: a refused client certificate shows on the first read.
            tls.sendall(
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
            )
            answer = tls.recv(1024)
    except (ssl.SSLError, ConnectionError, OSError) as exc:
        return type(exc).__name__
    # An accepted client gets the server's HTTP/2 SETTINGS; a refused one a close.
    return "ok" if answer else "closed"


@pytest.fixture(scope="module")
def pkis(tmp_path_factory: pytest.TempPathFactory) -> tuple[Pki, Pki]:
    root = tmp_path_factory.mktemp("pki")
    return Pki(root, "first"), Pki(root, "second")


@pytest.fixture(params=SERVERS)
def mtls_server(
    request: pytest.FixtureRequest, pkis: tuple[Pki, Pki], tmp_path: Path
) -> Iterator[tuple[Supervisor, Path]]:
    first, _ = pkis
    serving = tmp_path / "serving"
    serving.mkdir()
    _install(first.server, first.ca.path, serving)
    sup = Supervisor(
        request.param,
        workers=1,
        tls=(serving / "server.crt", serving / "server.key", serving / "ca.crt"),
    )
    try:
        sup.wait_serving()
        yield sup, serving
    finally:
        sup.close()


def test_mutual_tls_admits_only_clients_of_its_ca(
    mtls_server: tuple[Supervisor, Path], pkis: tuple[Pki, Pki]
) -> None:
    server, _ = mtls_server
    first, second = pkis
    assert _call(server.port, first.ca.path, first.client) == b"1"
    # No client certificate, or one from another CA: refused at the handshake.
    assert _handshake(server.port, first.ca.path, None) != "ok"
    assert _handshake(server.port, first.ca.path, second.client) != "ok"
    assert _handshake(server.port, first.ca.path, first.client) == "ok"
    with pytest.raises(grpc.RpcError) as caught:
        _call(server.port, first.ca.path, None, timeout=5)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    # Plaintext gets no gRPC answer either.
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        with pytest.raises(grpc.RpcError):
            raw_unary(channel, SLEEP)(b"1", timeout=5)


def test_certificates_are_reloaded_from_disk(
    mtls_server: tuple[Supervisor, Path], pkis: tuple[Pki, Pki]
) -> None:
    """Rotate to a new CA's server certificate and client CA: new connections
    use them (clients of the old CA are refused), without a restart."""
    server, serving = mtls_server
    first, second = pkis
    assert _call(server.port, first.ca.path, first.client) == b"1"
    _install(second.server, second.ca.path, serving)
    deadline = time.monotonic() + 30
    while True:
        try:
            if _call(server.port, second.ca.path, second.client, timeout=5) == b"1":
                break
        except grpc.RpcError:
            pass
        assert time.monotonic() < deadline, "the new certificates were never served"
        time.sleep(0.2)
    assert _handshake(server.port, first.ca.path, first.client) != "ok"


@pytest.mark.parametrize("kind", SERVERS)
def test_server_tls_without_a_client_ca(kind: str, pkis: tuple[Pki, Pki], tmp_path: Path) -> None:
    first, _ = pkis
    sup = Supervisor(kind, workers=1, tls=(first.server.cert, first.server.key))
    try:
        sup.wait_serving()
        assert _call(sup.port, first.ca.path) == b"1"
        with grpc.insecure_channel(f"127.0.0.1:{sup.port}") as channel:
            with pytest.raises(grpc.RpcError):
                raw_unary(channel, SLEEP)(b"1", timeout=5)
    finally:
        sup.close()
