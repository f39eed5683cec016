"""The forwarding hop's TLS check (``MESHPLANE_REPLICA_CA``), against a real HTTPS server.

Peers are reached by pod IP, which their certificate need not name: with the
cluster's CA the chain is checked and the host name is not; another CA, or the
system's CAs, refuse. The server here answers on 127.0.0.2, an address its
certificate does not name.
"""

from __future__ import annotations

import http.server
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mgmt_api.service.replicas import peer_tls
from tests.support.certs import CertificateAuthority


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[tuple[str, CertificateAuthority, CertificateAuthority]]:
    for name in ("ours", "theirs"):
        (tmp_path / name).mkdir()
    ca = CertificateAuthority(tmp_path / "ours")
    other = CertificateAuthority(tmp_path / "theirs")
    issued = ca.issue("mgmt-api.example")
    server = http.server.ThreadingHTTPServer(("127.0.0.2", 0), _Ok)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(issued.cert, issued.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.2:{server.server_address[1]}/", ca, other
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_the_clusters_ca_admits_a_peer_by_address_and_others_refuse(
    peer: tuple[str, CertificateAuthority, CertificateAuthority],
) -> None:
    url, ours, theirs = peer
    assert httpx.get(url, verify=peer_tls(str(ours.path)), timeout=10).status_code == 200
    for refusing in (peer_tls(str(theirs.path)), peer_tls(None)):
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(url, verify=refusing, timeout=10)
