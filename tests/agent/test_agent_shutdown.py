"""SIGTERM stops a real ``meshplane-agent`` cleanly whatever its tunnel is doing.

Two cases where the tunnel never opens: the management plane refuses it
(a real mgmt-api, another cluster's key: PERMISSION_DENIED on every attempt),
and a socket that accepts TCP and never answers (a connect in flight). In
both, SIGTERM ends the attempt at once and the agent exits 0 within the
documented drain grace, with no error-level log line and no task left
pending; and a refused attempt leaves no task behind (the agent logs the
event loop's task count with each retry).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent.fleet import Agent, Fleet
from tests.support.processes import terminate, wait_until

# The documented drain (5 s for unary calls) plus room for a loaded machine;
# before the fix a connect in flight held the agent for gRPC's 20 s connect timeout.
GRACE_SECONDS = 10.0


def _log_lines(path: Path) -> list[dict[str, Any]]:
    entries = []
    for raw in path.read_text().splitlines():
        assert "Task was destroyed" not in raw, raw
        try:
            entries.append(json.loads(raw))
        except ValueError:
            raise AssertionError(f"not a JSON log line: {raw[:300]}") from None
    return entries


def _retries(path: Path) -> list[dict[str, Any]]:
    return [e for e in _log_lines(path) if e.get("msg", "").startswith("tunnel to the management")]


def _stop_cleanly(agent: Agent) -> list[dict[str, Any]]:
    """SIGTERM; the agent must exit 0 within the grace; its log lines."""
    proc = agent.service.proc
    assert proc is not None
    code = terminate(proc, grace=GRACE_SECONDS)  # SIGKILL after the grace: -9
    agent.service.proc = None
    assert code == 0, agent.log.read_text()[-3000:]
    lines = _log_lines(agent.log)
    errors = [e for e in lines if e.get("level") in ("error", "critical")]
    assert errors == []
    assert lines[-1]["msg"] == "agent stopped"
    return lines


def test_an_agent_the_server_refuses_leaks_nothing_and_stops_at_once(fleet: Fleet) -> None:
    """Cluster b's agent with only cluster a's key (no clusterFqn to check at start-up)."""
    bare = fleet.tmp / "shutdown-bare-a.json"
    bare.write_text(fleet.secrets["a"]["jwk"])
    agent = Agent(fleet.tmp, fleet.mgmt, "b", bare, fleet.proxies_file).start()
    try:
        # --max-backoff 1: an attempt a second or so
        retries = wait_until(
            lambda: (r := _retries(agent.log)) and len(r) >= 8 and r,
            timeout=90,
            what="eight refused attempts",
        )
        assert {r["code"] for r in retries} == {"PERMISSION_DENIED"}
        tasks = [r["tasks"] for r in retries]
        # the same tasks between any two attempts: none is left behind by one
        assert max(tasks[1:]) <= tasks[1], tasks
        _stop_cleanly(agent)
    finally:
        agent.stop()


@pytest.fixture
def black_hole() -> Iterator[socket.socket]:
    """A listening socket that accepts connections and never says a word."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        listener.setblocking(False)
        yield listener


def test_sigterm_during_a_connect_that_never_answers_exits_0_at_once(
    fleet: Fleet, black_hole: socket.socket
) -> None:
    port = black_hole.getsockname()[1]
    agent = Agent(fleet.tmp, fleet.mgmt, "a", fleet.credentials("a"), fleet.proxies_file)
    address = agent.service.args.index("--control-plane") + 1
    agent.service.args[address] = f"grpc://127.0.0.1:{port}"
    held: list[socket.socket] = []

    def accepted() -> bool:
        try:
            held.append(black_hole.accept()[0])
        except BlockingIOError:
            return False
        return True

    agent.start()
    try:
        wait_until(accepted, timeout=30, what="the agent to connect")
        assert agent.service.proc is not None and agent.service.proc.poll() is None
        lines = _stop_cleanly(agent)
        assert not any(e.get("msg") == "tunnel connected" for e in lines)
    finally:
        agent.stop()
        for conn in held:
            conn.close()


def test_a_connected_agent_drains_and_exits_0(fleet: Fleet) -> None:
    """The ordinary case, held to the same standard."""
    fleet.create_cluster("shut")
    agent = fleet.start_agent("shut")
    lines = _stop_cleanly(agent)
    assert any(e.get("msg") == "tunnel connected" for e in lines)
