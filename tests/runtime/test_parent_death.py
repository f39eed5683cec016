"""meshplane.parent_death: a foreign binary started tied to its parent ends with it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from meshplane.parent_death import tied_command
from tests.support.processes import wait_until

# The parent starts a tied ``sleep`` keeping its pid (exec, not a child), says
# the pid, and waits: SIGKILLed, it cannot stop the child itself.
PARENT = """
import subprocess, sys, time
from meshplane.parent_death import tied_command
child = subprocess.Popen(tied_command([sys.argv[1], "300"]))
print(child.pid, flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for the reaper."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_the_tied_binary_gets_sigterm_when_its_parent_is_killed() -> None:
    sleep = shutil.which("sleep")
    assert sleep is not None
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, sleep],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    child = 0
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        # The exec happened: the pid now runs ``sleep`` itself, not the interpreter.
        wait_until(lambda: os.readlink(f"/proc/{child}/exe") == os.path.realpath(sleep), 30)
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        wait_until(lambda: not _alive(child), 30, "the tied child to end with its parent")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if child and _alive(child):  # the test failed: it still must not outlive it
            os.kill(child, signal.SIGKILL)


def test_the_command_runs_the_binary_with_its_arguments() -> None:
    done = subprocess.run(
        tied_command(["/bin/echo", "a", "b c"]), check=True, capture_output=True, text=True
    )
    assert done.stdout == "a b c\n"
