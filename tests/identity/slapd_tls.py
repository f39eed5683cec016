"""A throwaway slapd that speaks StartTLS and ldaps, with a test CA made on the fly.

Built on ``tests.support.slapd`` (same schema, accounts and seeding) and the
throw-away PKI of ``tests.support.certs``; it adds the TLS directives and an
``ldaps://`` listener. The server certificate is for 127.0.0.1 (and
localhost), signed by a CA that exists only in the test's temp directory,
so a client that verifies certificates accepts it only when given that CA.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.support.certs import CertificateAuthority
from tests.support.net import free_port
from tests.support.slapd import Slapd, start_slapd


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


def start_tls_slapd(tmp: Path) -> TlsSlapd:
    """slapd with TLS on ``ldap://`` (StartTLS) and on ``ldaps://``; the caller stops it."""
    workdir = tmp / "slapd-tls"
    workdir.mkdir(parents=True)
    ca = CertificateAuthority(workdir, "ca")
    other = CertificateAuthority(workdir, "other-ca")
    issued = ca.issue("127.0.0.1")
    tls = (
        f"TLSCACertificateFile {ca.path}\n"
        f"TLSCertificateFile {issued.cert}\n"
        f"TLSCertificateKeyFile {issued.key}\n"
    )
    ldaps_port = free_port()
    server = start_slapd(tls=tls, ldaps_port=ldaps_port, workdir=workdir)
    return TlsSlapd(server, ldaps_port, ca.path, other.path)
