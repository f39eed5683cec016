"""The README's section 1 (ext_authz on its own) works copy-pasted.

Its shell blocks are taken from README.md as they are, joined into one bash
script and run: the server it starts in the background, the readiness loop,
the token, the two HTTP-mode curls and the gRPC check, then ``kill %1``.
Only the ports (free ones, so a busy 9191 on this machine does not matter)
and ``uv run extauthz`` (this interpreter's ``-m extauthz.cli``, the same
code) are substituted. The script runs in its own session, and nothing of
that session may be left once it is done.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.net import free_port

README = Path(__file__).resolve().parents[2] / "README.md"


def section_one_commands() -> str:
    text = README.read_text()
    start = text.index("### 1. ext_authz")
    end = text.index("### 2.", start)
    blocks = re.findall(r"```sh\n(.*?)```", text[start:end], flags=re.DOTALL)
    assert len(blocks) >= 4, blocks
    return "\n".join(blocks)


def session_alive(sid: int) -> list[int]:
    """Pids whose session is ``sid`` (zombies excluded)."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After "(comm)": state, ppid, pgrp, session, ...
        if int(fields[3]) == sid and fields[0] != "Z":
            alive.append(int(entry.name))
    return alive


def test_section_one_starts_its_server_and_every_command_answers() -> None:
    script = section_one_commands()
    assert "extauthz serve" in script and "kill %1" in script
    grpc_port, http_port = free_port(), free_port()
    script = (
        script.replace("127.0.0.1:9191", f"127.0.0.1:{grpc_port}")
        .replace("127.0.0.1:9192", f"127.0.0.1:{http_port}")
        .replace("uv run extauthz", f"{sys.executable} -m extauthz.cli")
    )
    proc = subprocess.Popen(
        ["bash", "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, output
        assert "HTTP/1.1 200" in output, output
        assert "HTTP/1.1 403" in output, output
        assert "x-ext-authz-reason: path_not_allowed" in output, output
        assert '"allowed": true' in output, output
        deadline = time.monotonic() + 30
        while session_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not session_alive(proc.pid), "kill %1 left the server running"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
