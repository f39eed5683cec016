"""Echo-app supervisors as subprocesses, on either server, for the runtime tests."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.support.net import free_port, wait_for_port

SUPERVISOR = textwrap.dedent(
    """
    import sys
    from meshplane.server import ServeOptions, serve
    from tests.runtime.echo_app import make_app, make_slow_app
    listen, metrics, kind, workers, slow = sys.argv[1:]
    factory = make_slow_app if slow == "slow" else make_app
    sys.exit(serve(factory, ServeOptions(listen=listen, workers=int(workers),
                   metrics_listen=metrics, grace_seconds=5.0, server=kind), service="echo"))
    """
)

SERVERS = ("envoy", "grpcio")


class Supervisor:
    """A supervisor subprocess (2 echo workers) and its ports."""

    def __init__(self, kind: str, *, slow: bool = False, workers: int = 2) -> None:
        self.kind = kind
        self.stderr = b""
        self.port, self.metrics_port = free_port(), free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SUPERVISOR, f"127.0.0.1:{self.port}",
             f"127.0.0.1:{self.metrics_port}", kind, str(workers), "slow" if slow else "-"],
            stderr=subprocess.PIPE,
            cwd=os.getcwd(),
        )  # fmt: skip

    def wait_serving(self) -> None:
        wait_for_port(self.port, timeout=60)
        wait_for_port(self.metrics_port, timeout=60)

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
        return self.stderr
