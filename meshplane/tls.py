"""TLS and mutual TLS for every listener, with certificates followed on disk.

Certificates are rotated by replacing files (cert-manager, a Kubernetes
Secret mount, certbot); no listener needs a restart for it, and a bad new
pair (unreadable, a key not matching yet) is refused while the previous one
keeps serving. One description of a listener's files (:class:`ListenerTlsFiles`:
certificate chain, key, optional client CA), three servers:

- HTTP listeners on asyncio/uvloop (mgmt-api's REST port and console, and
  ``--server h2``'s gRPC port, which offers ``h2`` in ALPN):
  :class:`ReloadingServerContext` is an :class:`ssl.SSLContext` that answers
  each new connection (``wrap_bio``) from the newest *valid* context built
  from the files, which it looks at (``stat``) at most once a second;
- grpcio servers (the policy stream, the agent tunnel):
  :func:`grpcio_credentials` uses grpcio's dynamic credentials, whose fetcher
  runs at every new handshake and re-reads the files only when one changed;
- Envoy-based servers (Check and ShouldRateLimit on pyvoy):
  :func:`envoy_sds_documents` delivers the files through SDS with a
  ``watched_directory``; Envoy re-reads them when a file is moved into that
  directory, which is how Kubernetes (the ``..data`` symlink swap) and
  cert-manager update mounted Secrets (elsewhere: write, then rename).

With a client CA every client must present a certificate chaining to it,
and one that does not is refused during the handshake (envoyproxy/ratelimit's
``GRPC_SERVER_USE_TLS`` + ``GRPC_CLIENT_TLS_CACERT``): anyone who can reach
an unprotected rate-limit port could drain any client's bucket. The
application still authenticates the caller.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

log = logging.getLogger(__name__)

# One stat triple per file; None when the file is missing.
Signature = tuple[tuple[int, int, int] | None, ...]

# Names of SDS resources (certificate files), not secret values.
SERVER_CERT_SECRET = "meshplane_server_cert"  # noqa: S105
CLIENT_CA_SECRET = "meshplane_client_ca"  # noqa: S105


@dataclass(frozen=True)
class ListenerTlsFiles:
    """PEM files of a listener: certificate chain, private key, optional client CA."""

    cert: str
    key: str
    client_ca: str | None = None

    def absolute(self) -> ListenerTlsFiles:
        return ListenerTlsFiles(
            str(Path(self.cert).absolute()),
            str(Path(self.key).absolute()),
            str(Path(self.client_ca).absolute()) if self.client_ca else None,
        )

    def paths(self) -> tuple[str, ...]:
        return (self.cert, self.key) + ((self.client_ca,) if self.client_ca else ())

    @property
    def mode(self) -> str:
        """``tls`` or ``mtls``, for logs."""
        return "mtls" if self.client_ca else "tls"

    def check_readable(self) -> None:
        """Raise OSError naming the first file that cannot be read (at startup)."""
        for path in self.paths():
            with open(path, "rb"):
                pass


def tls_files_from(
    cert: str | None, key: str | None, client_ca: str | None, *, env_prefix: str
) -> ListenerTlsFiles | None:
    """The files a listener's settings name, or None (plaintext).

    A key without a certificate (or the reverse), or a client CA without
    both, is a configuration error naming the variables to set.
    """
    if not cert and not key:
        if client_ca:
            raise ValueError(f"{env_prefix}_CLIENT_CA needs {env_prefix}_CERT and _KEY")
        return None
    if not cert or not key:
        raise ValueError(f"give both {env_prefix}_CERT and {env_prefix}_KEY")
    return ListenerTlsFiles(cert, key, client_ca)


def read_pem(path: str, what: str, listener: str) -> bytes:
    """The file's bytes; an unreadable file is an OSError that names it and its role."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise OSError(f"cannot read the {listener}'s TLS {what} {path}: {exc}") from None


def file_signature(paths: Sequence[str]) -> Signature:
    """What identifies the files' current content without reading them."""
    out: list[tuple[int, int, int] | None] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append(None)
        else:
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(out)


# ---- HTTP listeners (asyncio / uvloop) -------------------------------------------------


def build_server_context(
    files: ListenerTlsFiles, listener: str = "listener", alpn: Sequence[str] = ()
) -> ssl.SSLContext:
    """A TLS 1.2+ server context from the files; raises naming the file at fault.

    ``alpn``: the protocols offered in ALPN (``["h2"]`` for a gRPC listener:
    gRPC clients refuse a server that selects none).
    """
    for path, what in ((files.cert, "certificate"), (files.key, "key")):
        read_pem(path, what, listener)  # a clear error for a missing or unreadable file
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(files.cert, files.key)
    except ssl.SSLError as exc:
        raise ssl.SSLError(
            f"the {listener}'s TLS certificate {files.cert} and key {files.key} "
            f"do not load together: {exc}"
        ) from None
    if files.client_ca:
        ca = read_pem(files.client_ca, "client CA", listener)
        try:
            context.load_verify_locations(cadata=ca.decode("ascii", "replace"))
        except ssl.SSLError as exc:
            raise ssl.SSLError(
                f"the {listener}'s TLS client CA {files.client_ca} does not load: {exc}"
            ) from None
        context.verify_mode = ssl.CERT_REQUIRED
    if alpn:
        context.set_alpn_protocols(list(alpn))
    return context


def should_check(last_check: float, now: float, interval: float) -> bool:
    """Whether the files are due for a look (pure; the clock is the caller's)."""
    return now - last_check >= interval


class ReloadingServerContext(ssl.SSLContext):
    """An SSLContext whose connections use the newest valid context of ``files``.

    Only ``wrap_bio`` (what asyncio and uvloop call per accepted connection)
    is delegated; the instance's own settings are never used for a handshake.
    """

    _files: ListenerTlsFiles
    _listener: str
    _alpn: tuple[str, ...]
    _interval: float
    _clock: Callable[[], float]
    _lock: threading.Lock
    _current: ssl.SSLContext
    _signature: Signature
    _failed_signature: Signature | None
    _last_check: float
    reloads: int

    def __new__(cls, files: ListenerTlsFiles, **_kw: Any) -> ReloadingServerContext:
        return super().__new__(cls, ssl.PROTOCOL_TLS_SERVER)

    def __init__(
        self,
        files: ListenerTlsFiles,
        *,
        listener: str = "listener",
        check_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        alpn: Sequence[str] = (),
    ) -> None:
        self._files = files
        self._listener = listener
        self._alpn = tuple(alpn)
        self._interval = check_interval
        self._clock = clock
        self._lock = threading.Lock()
        self._signature = file_signature(files.paths())
        self._current = build_server_context(files, listener, alpn)  # errors stop the start
        self._failed_signature = None
        self._last_check = clock()
        self.reloads = 0

    @property
    def current(self) -> ssl.SSLContext:
        """The context new connections get (after a due look at the files)."""
        now = self._clock()
        if should_check(self._last_check, now, self._interval):
            self._maybe_reload(now)
        return self._current

    def _maybe_reload(self, now: float) -> None:
        with self._lock:
            self._last_check = now
            signature = file_signature(self._files.paths())
            if signature in (self._signature, self._failed_signature):
                return
            try:
                context = build_server_context(self._files, self._listener, self._alpn)
            except (OSError, ssl.SSLError) as exc:
                self._failed_signature = signature
                log.warning(
                    "TLS files changed but do not load; still serving the previous certificate",
                    extra={"listener": self._listener, "error": str(exc)},
                )
                return
            self._current, self._signature, self._failed_signature = context, signature, None
            self.reloads += 1
            log.info("TLS certificate reloaded", extra={"listener": self._listener})

    def wrap_bio(self, *args: Any, **kwargs: Any) -> ssl.SSLObject:
        return self.current.wrap_bio(*args, **kwargs)


# ---- grpcio servers ----------------------------------------------------------------------


def _certificate_configuration(files: ListenerTlsFiles) -> Any:
    key = Path(files.key).read_bytes()
    cert = Path(files.cert).read_bytes()
    ca = Path(files.client_ca).read_bytes() if files.client_ca else None
    return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)


def grpcio_credentials(files: ListenerTlsFiles) -> grpc.ServerCredentials:
    """Server credentials that pick up changed files at the next handshake."""
    stamp = file_signature(files.paths())
    initial = _certificate_configuration(files)

    def fetch() -> Any:
        nonlocal stamp
        current = file_signature(files.paths())
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


# ---- Envoy-based servers -----------------------------------------------------------------


def envoy_sds_documents(files: ListenerTlsFiles) -> dict[str, dict[str, Any]]:
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


def envoy_transport_socket(files: ListenerTlsFiles, sds_dir: Path) -> dict[str, Any]:
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
