"""Loopback networking helpers shared by every test suite."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

_TCP_LISTEN = "0A"


#: Every port :func:`free_port` handed out in this process (at most the ephemeral range).
_HANDED_OUT: set[int] = set()
_HANDING = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free a moment ago on ``host``, never one this
    process was given before.

    The kernel may pick a port it just released again, so two calls in a row
    (a server's REST and gRPC ports) could get the same one, and the server
    then refuses to start (seen on CI). Remembering what was handed out rules
    that out within a test process; the race between closing the probe and
    the server binding it remains, and does not matter on a quiet loopback.
    """
    with _HANDING:
        for _ in range(64):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                port = int(s.getsockname()[1])
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                return port
    raise RuntimeError("no port this process was not already given")


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct free ports: every probe stays bound until all are
    chosen, so the kernel cannot hand the same port out twice (``free_port``
    called in a loop can, and a command given one port for two roles refuses it)."""
    with contextlib.ExitStack() as stack:
        probes = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                  for _ in range(count)]  # fmt: skip
        for probe in probes:
            probe.bind((host, 0))
        ports = [int(probe.getsockname()[1]) for probe in probes]
    with _HANDING:
        _HANDED_OUT.update(ports)
    return ports


def wait_for_port(port: int, host: str = "127.0.0.1", timeout: float = 15.0) -> None:
    """Block until something accepts TCP connections on ``host:port``."""
    deadline = time.monotonic() + timeout
    last: OSError | None = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError as exc:  # not listening yet
            last = exc
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout}s: {last}")


def wait_for_socket(path: Path, timeout: float = 15.0) -> None:
    """Block until something accepts connections on the Unix socket ``path``."""
    deadline = time.monotonic() + timeout
    last: OSError | None = None
    while time.monotonic() < deadline:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(0.5)
                s.connect(str(path))
                return
        except OSError as exc:  # not listening yet
            last = exc
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {path} after {timeout}s: {last}")


def listening(port: int) -> bool:
    """Whether any socket on this host listens on TCP ``port``, as the kernel
    sees it (``/proc/net/tcp*``).

    Asking the kernel, not connecting, tells a closed listener from one whose
    process stopped accepting; and a connect to a loopback port in the
    ephemeral range may be answered by the connecting socket itself.
    """
    suffix = f":{port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[1].endswith(suffix) and fields[3] == _TCP_LISTEN:
                return True
    return False
