"""The webhook's certificate is re-read when its files change (cert-manager, a Secret mount):
new connections get the new certificate with no restart, and a broken pair is refused while
the previous certificate keeps serving. Real TLS handshakes against the injector process."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from cryptography import x509

from tests.injector.support import Injector, pod, review
from tests.support.certs import CertificateAuthority
from tests.support.processes import wait_until


def served_serial(injector: Injector) -> int:
    context = injector.tls_context()
    with socket.create_connection(("127.0.0.1", injector.port), timeout=30) as sock:
        with context.wrap_socket(sock, server_hostname="localhost") as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def serial_of(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


def test_certificate_reload_on_file_change_and_broken_pair_keeps_the_old(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    first = ca.issue("injector")
    injector = Injector(tmp_path, ca, first)
    injector.service.start()
    try:
        assert served_serial(injector) == serial_of(first.cert)
        # A broken pair (the new certificate with the old key) is not taken.
        second = ca.issue("injector-next")
        os.replace(second.cert, first.cert)
        # The files are looked at when a connection arrives (at most once a second).
        wait_until(
            lambda: served_serial(injector) and "do not load" in injector.log.read_text(),
            timeout=60,
            what="the refusal",
        )
        assert served_serial(injector) != serial_of(first.cert)
        # Its key arrives: the pair loads and new connections get it.
        os.replace(second.key, first.key)
        wait_until(
            lambda: served_serial(injector) == serial_of(first.cert),
            timeout=60,
            what="the new certificate",
        )
        with injector.client() as client:
            assert client.post("/mutate", json=review(pod())).status_code == 200
        assert "meshplane_injector_tls_reloads 1.0" in injector.metrics()
    finally:
        injector.service.stop()
