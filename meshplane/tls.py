"""TLS and mutual TLS on the Check and ShouldRateLimit listeners, for either server.

Anyone who can reach an unprotected rate-limit port can drain any client's
bucket (and probe an ext_authz policy), so both services take a server
certificate and, optionally, a client CA; with a CA, a client without a
certificate it signed is refused during the handshake (envoyproxy/ratelimit's
``GRPC_SERVER_USE_TLS`` + ``GRPC_CLIENT_TLS_CACERT``).

Certificates are reloaded from disk without a restart:

- grpcio: :func:`grpcio_credentials` uses grpcio's dynamic credentials,
  whose fetcher runs at every new handshake; it re-reads the files only when
  one of them changed (a ``stat`` per file), so a rotated certificate is
  served from the next connection on;
- Envoy: :func:`envoy_sds_documents` delivers the files through SDS with a
  ``watched_directory``, and Envoy re-reads them when a file is moved into
  that directory, which is how Kubernetes (the ``..data`` symlink swap) and
  cert-manager update mounted Secrets. Replace files atomically (write
  elsewhere, then rename) in other setups.

Either way a bad new pair (unreadable, key not matching) is refused and the
previous one stays in use.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

log = logging.getLogger(__name__)

# Names of SDS resources (certificate files), not secret values.
SERVER_CERT_SECRET = "meshplane_server_cert"  # noqa: S105
CLIENT_CA_SECRET = "meshplane_client_ca"  # noqa: S105


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of a listener: certificate chain, private key, optional client CA."""

    cert: str
    key: str
    client_ca: str | None = None

    def absolute(self) -> TlsFiles:
        return TlsFiles(
            str(Path(self.cert).absolute()),
            str(Path(self.key).absolute()),
            str(Path(self.client_ca).absolute()) if self.client_ca else None,
        )

    def paths(self) -> tuple[str, ...]:
        return (self.cert, self.key) + ((self.client_ca,) if self.client_ca else ())

    def check_readable(self) -> None:
        """Raise OSError naming the first file that cannot be read (at startup)."""
        for path in self.paths():
            with open(path, "rb"):
                pass


_Stamp = tuple[tuple[int, int, int, int], ...]


def _stamp(files: TlsFiles) -> _Stamp:
    stamps = []
    for path in files.paths():
        try:
            st = Path(path).stat()
        except OSError:
            stamps.append((0, 0, 0, 0))
            continue
        stamps.append((st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns))
    return tuple(stamps)


def _certificate_configuration(files: TlsFiles) -> Any:
    key = Path(files.key).read_bytes()
    cert = Path(files.cert).read_bytes()
    ca = Path(files.client_ca).read_bytes() if files.client_ca else None
    return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)


def grpcio_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """Server credentials that pick up changed files at the next handshake."""
    stamp = _stamp(files)
    initial = _certificate_configuration(files)

    def fetch() -> Any:
        nonlocal stamp
        current = _stamp(files)
        if current == stamp:
            return None  # unchanged: grpcio keeps the configuration it has
        stamp = current
        try:
            configuration = _certificate_configuration(files)
        except OSError as exc:
            log.error("TLS files unreadable; keeping the previous ones", extra={"error": str(exc)})
            return None
        log.info("TLS certificates reloaded", extra={"cert": files.cert})
        return configuration

    return grpc.dynamic_ssl_server_credentials(
        initial, fetch, require_client_authentication=files.client_ca is not None
    )


def envoy_sds_documents(files: TlsFiles) -> dict[str, dict[str, Any]]:
    """The SDS files (``path_config_source``) of the listener's secrets, by secret name.

    One file per secret: Envoy's file-based SDS takes exactly one resource a file.
    """
    files = files.absolute()
    documents = {
        SERVER_CERT_SECRET: {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",
            "name": SERVER_CERT_SECRET,
            "tls_certificate": {
                "certificate_chain": {"filename": files.cert},
                "private_key": {"filename": files.key},
                "watched_directory": {"path": str(Path(files.cert).parent)},
            },
        }
    }
    if files.client_ca:
        documents[CLIENT_CA_SECRET] = {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",
            "name": CLIENT_CA_SECRET,
            "validation_context": {
                "trusted_ca": {"filename": files.client_ca},
                "watched_directory": {"path": str(Path(files.client_ca).parent)},
            },
        }
    return {name: {"resources": [document]} for name, document in documents.items()}


def envoy_transport_socket(files: TlsFiles, sds_dir: Path) -> dict[str, Any]:
    """The listener's DownstreamTlsContext, its secrets read from ``sds_dir/<name>.json``."""

    def source(name: str) -> dict[str, Any]:
        path = sds_dir / f"{name}.json"
        return {"path_config_source": {"path": str(path)}, "resource_api_version": "V3"}

    common: dict[str, Any] = {
        "tls_certificate_sds_secret_configs": [
            {"name": SERVER_CERT_SECRET, "sds_config": source(SERVER_CERT_SECRET)}
        ],
        "alpn_protocols": ["h2"],
    }
    if files.client_ca:
        common["validation_context_sds_secret_config"] = {
            "name": CLIENT_CA_SECRET,
            "sds_config": source(CLIENT_CA_SECRET),
        }
    return {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3."
            "DownstreamTlsContext",
            "common_tls_context": common,
            "require_client_certificate": files.client_ca is not None,
        },
    }
