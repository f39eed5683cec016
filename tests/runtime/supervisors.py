"""Echo-app supervisors as subprocesses, on any server, for the runtime tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.support.backends import BACKENDS
from tests.support.net import free_port, wait_for_port

SUPERVISOR = textwrap.dedent(
    """
    import sys
    from meshplane.server import serve
    from meshplane.server_contract import ServeOptions
    from meshplane.tls import ListenerTlsFiles
    from tests.runtime.echo_app import make_app, make_slow_app
    listen, metrics, kind, workers, slow, *tls = sys.argv[1:]
    factory = make_slow_app if slow == "slow" else make_app
    files = ListenerTlsFiles(tls[0], tls[1], tls[2] if len(tls) > 2 else None) if tls else None
    sys.exit(serve(factory, ServeOptions(listen=listen, workers=int(workers), tls=files,
                   metrics_listen=metrics, grace_seconds=5.0, server=kind), service="echo"))
    """
)

SERVERS = BACKENDS


class Supervisor:
    """A supervisor subprocess (echo workers; TLS files: cert, key[, client CA]) and its ports."""

    def __init__(
        self,
        kind: str,
        *,
        slow: bool = False,
        workers: int = 2,
        tls: Sequence[Path] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.kind = kind
        self.stderr = b""
        self.port, self.metrics_port = free_port(), free_port()
        # The supervisor's run and metrics directories go here: a test that
        # kills it outright leaves them behind, and close() removes them.
        self.tmp = Path(tempfile.mkdtemp(prefix="meshplane-supervisor-test-"))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SUPERVISOR, f"127.0.0.1:{self.port}",
             f"127.0.0.1:{self.metrics_port}", kind, str(workers), "slow" if slow else "-",
             *map(str, tls)],
            stderr=subprocess.PIPE,
            cwd=os.getcwd(),
            env={**os.environ, **(env or {}), "TMPDIR": str(self.tmp)},
        )  # fmt: skip

    def wait_serving(self) -> None:
        """Until both ports answer; a supervisor that exits first fails at once."""
        deadline = time.monotonic() + 60
        for port in (self.metrics_port, self.port):
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"supervisor exited: {self.close().decode()[-3000:]}")
                try:
                    wait_for_port(port, timeout=0.5)
                    break
                except TimeoutError:
                    if time.monotonic() > deadline:
                        raise

    def close(self) -> bytes:
        """SIGTERM (the workers drain and exit with it); its stderr."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait(10)
        if self.proc.stderr is not None and not self.proc.stderr.closed:
            self.stderr = self.proc.stderr.read()
            self.proc.stderr.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
        return self.stderr
