"""The rate-limit service under a real supervisor, on either server, for tests.

``Server`` starts ``meshplane.server.serve`` in a subprocess with the clock
standing still at ``T0`` (see ``fixed_clock``), on any backend
(``tests.support.backends``), counting in a real redis-server; an optional settings file is
loaded over the tests' base settings, as ``ratelimit serve --settings`` does.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
from envoy.service.ratelimit.v3 import rls_pb2

from tests.ratelimit.conftest import T0, request
from tests.support.backends import BACKENDS
from tests.support.grpc_raw import raw_unary
from tests.support.net import free_port, wait_for_port, wait_for_socket

METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
SERVERS = BACKENDS

SUPERVISOR = textwrap.dedent(
    """
    import functools, sys
    from pathlib import Path
    from meshplane.server import serve
    from meshplane.server_contract import ServeOptions
    from ratelimit.app import AppOptions
    from ratelimit.settings import Settings, load_settings
    from tests.ratelimit.fixed_clock import build_at
    config, redis_url, listen, kind, now, settings_file = sys.argv[1:]
    settings = Settings(store_timeout=0.5, failure_mode="unavailable")
    if settings_file:
        settings = load_settings(Path(settings_file), settings)
    options = AppOptions(config_path=config, redis_url=redis_url, settings=settings)
    sys.exit(serve(functools.partial(build_at, options, float(now)),
                   ServeOptions(listen=listen, server=kind, grace_seconds=2.0),
                   service="ratelimit"))
    """
)


class Server:
    """A ratelimit supervisor on a TCP port, or on a Unix socket in ``socket_dir``."""

    def __init__(
        self,
        kind: str,
        config: Path,
        redis_url: str,
        settings: Path | None = None,
        socket_dir: Path | None = None,
    ) -> None:
        self.kind = kind
        self.port = free_port()
        self.socket = None if socket_dir is None else socket_dir / f"{kind}.sock"
        listen = f"127.0.0.1:{self.port}" if self.socket is None else f"unix:{self.socket}"
        self.target = listen  # grpcio's client dials both forms
        # Its log, read only when it exits badly (a pipe nobody reads could fill).
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SUPERVISOR, str(config), redis_url,
             listen, kind, str(T0), str(settings or "")],
            stderr=self.log,
        )  # fmt: skip

    def wait_listening(self) -> None:
        if self.socket is None:
            wait_for_port(self.port, timeout=60)
        else:
            wait_for_socket(self.socket, timeout=60)

    def call(self, raw: bytes, timeout: float = 10) -> rls_pb2.RateLimitResponse | tuple[str, str]:
        """The response, or (status code name, details)."""
        options = [("grpc.max_send_message_length", 16 << 20)]
        with grpc.insecure_channel(self.target, options=options) as channel:
            try:
                answer: bytes = raw_unary(channel, METHOD)(raw, timeout=timeout)
            except grpc.RpcError as exc:
                return exc.code().name, exc.details() or ""
        return rls_pb2.RateLimitResponse.FromString(answer)

    def worker_rss(self) -> int:
        """Resident bytes of the worker: the supervisor's biggest child (a
        supervisor of spawned workers has a small resource-tracker process too)."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        return max(_rss(int(pid)) for pid in children.split())

    def close(self) -> None:
        self.proc.terminate()
        try:
            code = self.proc.wait(30)
            assert code == 0, f"the {self.kind} supervisor exited {code}:\n{self.log_tail()}"
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
            self.log.close()

    def log_tail(self, limit: int = 4000) -> str:
        """The end of the supervisor's log (its workers' too)."""
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-limit:]


@contextlib.contextmanager
def every_server(
    config: Path, redis_urls: dict[str, str], settings: Path | None = None
) -> Iterator[dict[str, Server]]:
    """One ready Server of each kind (each on its own Redis), stopped afterwards."""
    servers = {kind: Server(kind, config, redis_urls[kind], settings) for kind in SERVERS}
    try:
        for server in servers.values():
            server.wait_listening()
            wait_ready(server)
        yield servers
    finally:
        for server in servers.values():
            server.close()


def wait_ready(server: Server) -> None:
    """Until a call is decided (readiness follows the Redis probe)."""
    deadline = time.monotonic() + 30
    probe = request("warmup", [("k", "v")]).SerializeToString()
    while not isinstance(server.call(probe), rls_pb2.RateLimitResponse):
        assert time.monotonic() < deadline, "never answered"
        time.sleep(0.1)


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0  # a process that is exiting has no memory left
