"""Our own services as subprocesses, the way an operator runs them, for end-to-end tests.

One launcher for every e2e file: start ``python -m MODULE ARGS``, wait for
its port, and stop it the way Kubernetes does (SIGTERM, then SIGKILL after a
grace period). Its stderr (JSON logs) goes to a file whose tail is shown when
it fails to start.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, TypeVar

from tests.support.net import wait_for_port, wait_for_socket

T = TypeVar("T")


def terminate(proc: subprocess.Popen[Any], grace: float = 15.0) -> int:
    """Stop ``proc`` the way Kubernetes does: SIGTERM, ``grace`` seconds to drain,
    then SIGKILL; return its exit code once it is gone (at once if it already is)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def wait_until(
    predicate: Callable[[], T | Literal[False] | None], timeout: float = 10.0, what: str = ""
) -> T:
    """The first truthy value of ``predicate``, polled every 50 ms (so never its
    ``None`` or ``False``: a predicate returns those for "not yet")."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.05)


async def eventually(check: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    """:func:`wait_until` for a test's event loop: poll ``check`` every 20 ms,
    letting the loop run between polls (the condition usually depends on it)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        await asyncio.sleep(0.02)


def in_parallel(actions: Iterable[Callable[[], object]]) -> None:
    """Run ``actions`` at once, each on a thread; raise the first one's error once all ended.

    Starting or stopping a stack's processes is mostly waiting (for a port, for a
    drain): done side by side, it lasts as long as the slowest, not the sum."""
    todo = list(actions)
    if not todo:
        return
    with ThreadPoolExecutor(max_workers=len(todo)) as pool:
        futures = [pool.submit(action) for action in todo]
    for future in futures:
        future.result()


class Service:
    """A ``ratelimit`` / ``extauthz`` (or any ``python -m``) subprocess on ``port``
    (a TCP port on loopback, or the path of its Unix socket)."""

    def __init__(
        self,
        args: list[str],
        port: int | Path,
        log: Path,
        env: Mapping[str, str] | None = None,
        stdout: Path | None = None,
    ) -> None:
        """``stdout``: a file for the process's standard output (default: discarded)."""
        self.args, self.port, self.log, self.env = args, port, log, env
        self.stdout = stdout
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Service:
        return self.spawn().wait_started()

    def spawn(self) -> Service:
        """Start the process, without waiting for its port (:meth:`wait_started`)."""
        out = open(self.stdout, "ab") if self.stdout is not None else None  # noqa: SIM115
        with open(self.log, "ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "-m", *self.args],
                stdout=out if out is not None else subprocess.DEVNULL,
                stderr=log,
                env=dict(self.env) if self.env is not None else None,
            )
        if out is not None:
            out.close()
        return self

    def wait_started(self) -> Service:
        """Wait for the port of the process :meth:`spawn` started (stopped if it never opens)."""
        try:
            if isinstance(self.port, Path):
                wait_for_socket(self.port, timeout=60)
            else:
                wait_for_port(self.port, timeout=60)
        except Exception:
            self.stop()
            raise RuntimeError(self.log.read_text()[-3000:]) from None
        return self

    def stop(self) -> Any:
        """SIGTERM, 15 s to drain, then SIGKILL; the exit code (None if never started)."""
        code = None if self.proc is None else terminate(self.proc)
        self.proc = None
        return code
