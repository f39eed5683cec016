"""The demo upstream behind the gateway: its four paths, JSON logs, a clean SIGTERM.

Started as ``scripts/run`` starts it (``python -m demo.upstream``),
so what the tour shows through the gateway (echoed headers, a held-up
``/slow``) is what it answers directly.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from demo.upstream import MAX_SLOW_SECONDS, _seconds
from tests.support.net import free_port, wait_for_port


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    port = free_port()
    log = tmp_path / "upstream.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "demo.upstream", "--listen", f"127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        wait_for_port(port, timeout=30)
        yield f"http://127.0.0.1:{port}", proc, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_paths_logs_and_sigterm(upstream: tuple[str, subprocess.Popen[bytes], Path]) -> None:
    url, proc, log = upstream
    with httpx.Client(base_url=url, timeout=30) as http:
        echoed = http.get("/headers", headers={"x-demo": "1"})
        assert echoed.status_code == 200
        assert echoed.json()["headers"]["x-demo"] == "1"
        teapot = http.get("/status/418")
        assert teapot.status_code == 418 and teapot.json() == {"status": 418}
        assert http.get("/status/99").status_code == 404  # not an HTTP status we answer
        started = time.monotonic()
        slow = http.get("/slow", params={"seconds": "0.3"})
        assert slow.status_code == 200 and slow.json() == {"slept": 0.3}
        assert time.monotonic() - started >= 0.3
        assert http.get("/slow", params={"seconds": "soon"}).status_code == 400
        root = http.get("/")
        assert root.status_code == 200 and root.text.startswith("meshplane demo upstream")
        assert http.get("/nope").status_code == 404
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert {line["service"] for line in lines} == {"demo-upstream"}
    assert any(line["msg"] == "request" and line["path"] == "/headers" for line in lines)
    assert lines[-1]["msg"] == "stopped"


def test_slow_is_bounded() -> None:
    assert _seconds("1e9") == MAX_SLOW_SECONDS
    assert _seconds("-5") == 0.0
    assert _seconds("nan") is None
    assert _seconds("x") is None
