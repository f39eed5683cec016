"""The README's run command: the whole platform, seeded, and its printed commands work.

Starts ``python -m mgmt_api.demo`` (what ``scripts/run`` execs after setup)
on free ports in a temporary state directory, waits for its ``ready:`` line,
then runs the copy-paste commands it printed, with ``uv run meshctl`` and
``uv run extauthz`` replaced by this interpreter's ``-m meshctl`` and
``-m extauthz.cli`` (the same code, without re-resolving the environment).
Finally SIGTERM must stop the orchestrator and every child it started.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mgmt_api.demo.stack import PORT_ROLES, port_flag
from tests.support.net import free_port

PORT_FLAGS = tuple(port_flag(name) for name in PORT_ROLES)


class Orchestrator:
    def __init__(self, state: Path, ports: list[int] | None = None) -> None:
        argv = [sys.executable, "-m", "mgmt_api.demo", "--state-dir", str(state)]
        for flag, port in zip(PORT_FLAGS, ports or [free_port() for _ in PORT_FLAGS], strict=True):
            argv += [flag, str(port)]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith("ready:"):
                self.ready.set()
        self.ready.set()  # EOF: let the waiter see what happened

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def child_pids(self) -> dict[str, int]:
        found = (re.match(r"\s+([\w-]+): pid (\d+),", line) for line in self.lines)
        return {m.group(1): int(m.group(2)) for m in found if m}

    def printed_commands(self) -> list[str]:
        start = next(i for i, line in enumerate(self.lines) if line.startswith("Try, in"))
        return [
            line.strip()
            for line in self.lines[start + 1 :]
            if line.startswith("  ") and not line.strip().startswith("#")
        ]

    def kill_everything(self) -> None:
        """Last resort in ``finally``: nothing this test started may outlive it."""
        for pid in self.child_pids().values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); its state letter says it is gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.fixture
def orchestrator(tmp_path: Path) -> Iterator[Orchestrator]:
    orch = Orchestrator(tmp_path / ".run")
    try:
        yield orch
    finally:
        orch.kill_everything()


def localize(command: str) -> str:
    return command.replace("uv run meshctl", f"{sys.executable} -m meshctl").replace(
        "uv run extauthz", f"{sys.executable} -m extauthz.cli"
    )


def run_printed(commands: list[str]) -> list[tuple[int, str]]:
    """Run the printed commands in one shell (``TOKEN=...`` carries over);
    return (exit code, output) per command."""
    script = "".join(f"{{ {localize(c)}\n}} 2>&1\nrc=$?; echo; echo ::exit=$rc\n" for c in commands)
    done = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=180, check=False
    )
    parts = re.split(r"::exit=(\d+)\n", done.stdout)
    return [(int(parts[i + 1]), parts[i]) for i in range(0, len(parts) - 1, 2)]


def test_run_command_brings_up_the_platform_and_its_commands_show_429_and_403(
    orchestrator: Orchestrator,
) -> None:
    assert orchestrator.ready.wait(180), orchestrator.output
    assert any(line.startswith("ready:") for line in orchestrator.lines), orchestrator.output
    pids = orchestrator.child_pids()
    assert set(pids) == {"mgmt-api", "ratelimit", "extauthz"}

    commands = orchestrator.printed_commands()
    kinds = ["diag ratelimit", "TOKEN=", "/headers", "/admin", "diag check", "/status"]
    assert len(commands) == len(kinds), commands
    assert all(kind in command for kind, command in zip(kinds, commands, strict=True)), commands
    # The limit is per minute: do not let the over-limit calls straddle two.
    if 60 - time.time() % 60 < 10:
        time.sleep(60 - time.time() % 60 + 0.1)
    results = run_printed(commands)
    assert len(results) == len(commands), results

    code, text = results[0]  # 4 calls at 3/Minute
    assert code == 7, text
    assert "#3: OK" in text
    assert "#4: OVER_LIMIT" in text
    assert "x-ratelimit-limit: 3, 3;w=60" in text
    assert results[1][0] == 0, results[1]  # TOKEN=$(... token ...)
    assert "HTTP/1.1 200" in results[2][1], results[2]
    code, text = results[3]
    assert "HTTP/1.1 403" in text, text
    assert "x-ext-authz-reason: path_not_allowed" in text
    code, text = results[4]
    assert code == 7, text
    assert "DENIED: HTTP 403" in text
    assert '"appliedVersion"' in results[5][1], results[5]

    orchestrator.proc.send_signal(signal.SIGTERM)
    assert orchestrator.proc.wait(timeout=60) == 0, orchestrator.output
    orchestrator.reader.join(timeout=10)
    assert any(line.startswith("stopped:") for line in orchestrator.lines), orchestrator.output
    assert not [name for name, pid in pids.items() if pid_alive(pid)], orchestrator.output


def test_a_second_run_on_the_same_state_reuses_the_seed(tmp_path: Path) -> None:
    state = tmp_path / ".run"
    ports = [free_port() for _ in PORT_FLAGS]
    for attempt in range(2):
        orch = Orchestrator(state, ports)
        try:
            assert orch.ready.wait(180), orch.output
            assert any(line.startswith("ready:") for line in orch.lines), orch.output
            orch.proc.send_signal(signal.SIGINT)
            assert orch.proc.wait(timeout=60) == 0, orch.output
        finally:
            orch.kill_everything()
        if attempt == 0:
            assert "seeded: 8 created, 0 updated, 0 unchanged" in orch.output
            first_password = (state / "admin-password").read_text()
            first_key = (state / "cluster-credentials.json").read_text()
    assert "seeded: 0 created, 0 updated, 8 unchanged" in orch.output, orch.output
    assert (state / "admin-password").read_text() == first_password
    assert (state / "cluster-credentials.json").read_text() == first_key


@pytest.mark.parametrize("busy", ["--mgmt-port", "--gateway-admin-port"])
def test_a_busy_port_stops_it_before_anything_starts(tmp_path: Path, busy: str) -> None:
    """A port held by another program: exit 1 naming the port, its role and its
    flag, with no child started and the state dir untouched."""
    state = tmp_path / ".run"
    ports = dict(zip(PORT_FLAGS, (free_port() for _ in PORT_FLAGS), strict=True))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        ports[busy] = holder.getsockname()[1]
        argv = [sys.executable, "-m", "mgmt_api.demo", "--state-dir", str(state)]
        for flag, port in ports.items():
            argv += [flag, str(port)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done
    role = PORT_ROLES[busy.removeprefix("--").removesuffix("-port").replace("-", "_")]
    assert (
        f"port {ports[busy]} ({role}) on 127.0.0.1 is in use: pass {busy} N,"
        " or stop what listens there" in done.stderr
    ), done.stderr
    assert "pid" not in done.stdout, done.stdout
    assert not state.exists()


def test_a_port_given_twice_is_refused(tmp_path: Path) -> None:
    port = free_port()
    argv = [sys.executable, "-m", "mgmt_api.demo", "--state-dir", str(tmp_path / ".run")]
    argv += ["--mgmt-port", str(port), "--upstream-port", str(port)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done
    assert f"port {port} is given for both mgmt-api REST and demo upstream" in done.stderr
    assert not (tmp_path / ".run").exists()
