"""TLS for HTTP listeners: a server context that follows its PEM files on disk.

Certificates are rotated by replacing files (cert-manager, a Kubernetes
secret mount, certbot), and a management plane should not need a restart for
it. :class:`ReloadingServerContext` is an :class:`ssl.SSLContext` that the
asyncio (or uvloop) server accepts as it is; each new connection asks it for
an ``SSLObject`` (``wrap_bio``), and it answers from the newest *valid*
context built from the files:

* the files are looked at (``stat``: size, mtime, inode) at most once per
  ``check_interval`` seconds, so a busy listener does not stat per handshake;
* a changed signature rebuilds the whole context (certificate, key *and*
  client CA, so a CA can also be withdrawn, which loading more verify
  locations into a live context could not do);
* a rebuild that fails (a half-written file, a key that does not match the
  new certificate yet) keeps the last good context serving and is retried
  when the files change again; the failure is logged once per signature.

Connections already established keep the context they were accepted with.
With a client CA, every connection must present a certificate chaining to
it (mutual TLS); the application still authenticates the caller.
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

log = logging.getLogger(__name__)

# One stat triple per file; None when the file is missing.
Signature = tuple[tuple[int, int, int] | None, ...]


@dataclass(frozen=True)
class ServerTlsFiles:
    """A listener's certificate chain and key (PEM), and optionally the CA that
    client certificates must chain to."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None

    @property
    def paths(self) -> tuple[str, ...]:
        return (
            self.cert_file,
            self.key_file,
            *(() if not self.client_ca_file else (self.client_ca_file,)),
        )

    @property
    def mode(self) -> str:
        """``tls`` or ``mtls``, for logs."""
        return "mtls" if self.client_ca_file else "tls"


def tls_files_from(
    cert: str | None, key: str | None, client_ca: str | None, *, env_prefix: str
) -> ServerTlsFiles | None:
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
    return ServerTlsFiles(cert, key, client_ca)


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


def build_server_context(files: ServerTlsFiles, listener: str = "listener") -> ssl.SSLContext:
    """A TLS 1.2+ server context from the files; raises naming the file at fault."""
    for path, what in ((files.cert_file, "certificate"), (files.key_file, "key")):
        read_pem(path, what, listener)  # a clear error for a missing or unreadable file
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(files.cert_file, files.key_file)
    except ssl.SSLError as exc:
        raise ssl.SSLError(
            f"the {listener}'s TLS certificate {files.cert_file} and key {files.key_file} "
            f"do not load together: {exc}"
        ) from None
    if files.client_ca_file:
        ca = read_pem(files.client_ca_file, "client CA", listener)
        try:
            context.load_verify_locations(cadata=ca.decode("ascii", "replace"))
        except ssl.SSLError as exc:
            raise ssl.SSLError(
                f"the {listener}'s TLS client CA {files.client_ca_file} does not load: {exc}"
            ) from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def should_check(last_check: float, now: float, interval: float) -> bool:
    """Whether the files are due for a look (pure; the clock is the caller's)."""
    return now - last_check >= interval


class ReloadingServerContext(ssl.SSLContext):
    """An SSLContext whose connections use the newest valid context of ``files``.

    Only ``wrap_bio`` (what asyncio and uvloop call per accepted connection)
    is delegated; the instance's own settings are never used for a handshake.
    """

    _files: ServerTlsFiles
    _listener: str
    _interval: float
    _clock: Callable[[], float]
    _lock: threading.Lock
    _current: ssl.SSLContext
    _signature: Signature
    _failed_signature: Signature | None
    _last_check: float
    reloads: int

    def __new__(cls, files: ServerTlsFiles, **_kw: Any) -> ReloadingServerContext:
        return super().__new__(cls, ssl.PROTOCOL_TLS_SERVER)

    def __init__(
        self,
        files: ServerTlsFiles,
        *,
        listener: str = "listener",
        check_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._files = files
        self._listener = listener
        self._interval = check_interval
        self._clock = clock
        self._lock = threading.Lock()
        self._signature = file_signature(files.paths)
        self._current = build_server_context(files, listener)  # errors stop the start
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
            signature = file_signature(self._files.paths)
            if signature in (self._signature, self._failed_signature):
                return
            try:
                context = build_server_context(self._files, self._listener)
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
