"""The shared process model on every server (Envoy, h2): workers sharing a
port, metrics across workers, drain on SIGTERM, supervisor death, startup failure."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from meshplane.servers.envoy.server import AdminError, admin_post
from meshplane.servers.h2.server import running
from tests.runtime.echo_app import SERVICE, EchoApp
from tests.runtime.supervisors import SERVERS, SUPERVISOR, Supervisor
from tests.support.grpc_raw import raw_unary_aio
from tests.support.net import free_port, listening


def _sleep_call(channel: grpc.aio.Channel) -> grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]:
    return raw_unary_aio(channel, f"/{SERVICE}/Sleep")


async def test_in_process_server_reports_serving_and_answers() -> None:
    async with running(EchoApp()) as srv:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for name in ("", SERVICE):
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=name))
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            assert await _sleep_call(channel)(b"1") == b"1"


async def test_reflection_lists_the_app_health_and_reflection() -> None:
    async with running(EchoApp()) as srv:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            request = reflection_pb2.ServerReflectionRequest(list_services="")
            names: set[str] = set()
            async for reply in stub.ServerReflectionInfo(iter([request])):
                names |= {s.name for s in reply.list_services_response.service}
    assert {SERVICE, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= names


@pytest.fixture(params=SERVERS)
def supervisor(request: pytest.FixtureRequest) -> Iterator[Supervisor]:
    sup = Supervisor(request.param)
    try:
        sup.wait_serving()
        yield sup
    finally:
        sup.close()


def _workers_of(supervisor: int) -> list[int]:
    """The worker processes of a supervisor: spawned Pythons or Envoys (not its
    resource tracker)."""
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == supervisor and (
            b"spawn_main" in cmdline or b"--config-yaml" in cmdline
        ):
            pids.append(int(entry.name))
    return pids


def _running(pid: int) -> bool:
    """Some thread of the process is alive (an orphan's zombie may wait long
    for a reaper).

    Every thread counts, not just the main one: while a process exits, its
    main thread shows as a zombie until the last other thread is gone, and
    until then its sockets are still open.
    """
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return False
    for task in tasks:
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
            return True
    return False


def _metric_lines(metrics_port: int, name: str) -> list[str]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read()
    return [line for line in body.decode().splitlines() if line.startswith(name)]


def test_workers_share_the_port_and_metrics_cover_every_worker(supervisor: Supervisor) -> None:
    async def calls() -> None:
        # Separate channels are separate connections, which SO_REUSEPORT
        # spreads over both workers.
        for _ in range(40):
            async with grpc.aio.insecure_channel(
                f"127.0.0.1:{supervisor.port}", options=[("grpc.use_local_subchannel_pool", 1)]
            ) as channel:
                await _sleep_call(channel)(b"0")

    deadline = time.monotonic() + 60
    while True:
        asyncio.run(calls())
        lines = _metric_lines(supervisor.metrics_port, "meshplane_test_echo_calls_total{")
        if len(lines) >= 2 or time.monotonic() > deadline:
            break
    assert len(lines) >= 2, f"expected calls on both workers, got {lines}"
    total = sum(float(line.rsplit(" ", 1)[1]) for line in lines)
    assert total % 40 == 0 and total >= 40


def _wait_gone(pids: list[int], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_running(pid) for pid in pids), "workers outlived their supervisor"


def test_workers_exit_when_the_supervisor_is_killed(supervisor: Supervisor) -> None:
    """A supervisor killed outright cannot stop its workers; they notice that
    it is gone and drain and exit instead of serving on as orphans."""
    deadline = time.monotonic() + 30
    while len(workers := _workers_of(supervisor.proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(workers) == 2, workers
    supervisor.proc.kill()
    supervisor.proc.wait(10)
    _wait_gone(workers)
    assert not listening(supervisor.port)


@pytest.mark.parametrize("kind", SERVERS)
def test_a_supervisor_stopped_while_its_workers_start_exits_zero(kind: str) -> None:
    """SIGTERM while the workers still build their app (3 s here): a worker the
    drain's SIGTERM ends before it serves lost nothing, so the supervisor's
    exit is clean (on a loaded machine, a stop two seconds after the start
    reported a failure)."""
    sup = Supervisor(kind, slow=True)
    try:
        deadline = time.monotonic() + 30
        while len(_workers_of(sup.proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        sup.proc.send_signal(signal.SIGTERM)
        assert sup.proc.wait(30) == 0
    finally:
        stderr = sup.close()
    assert b"worker failed" not in stderr


@pytest.mark.parametrize("kind", SERVERS)
def test_a_supervisor_killed_while_its_workers_start_leaves_no_worker(kind: str) -> None:
    """The race a loaded CI machine showed: the supervisor dies while its
    workers are still starting (here, an app that takes 3 s to build). A
    worker that read its parent only once started took its new parent for
    the supervisor and served on forever; now none may survive."""
    sup = Supervisor(kind, slow=True)
    try:
        deadline = time.monotonic() + 30
        while len(workers := _workers_of(sup.proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(workers) == 2, workers
        sup.proc.kill()
        _wait_gone(workers, timeout=45)
    finally:
        sup.close()


def test_sigterm_drains_in_flight_calls_and_exits_zero(supervisor: Supervisor) -> None:
    """In-flight calls finish; a health Watch sees NOT_SERVING before the end;
    the port stops listening while the calls are still in flight, so a new
    connection is refused at once (and goes to another replica) instead of
    waiting in the accept queue of a server that will never accept it."""

    async def scenario() -> tuple[list[bytes], list[int], bool]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{supervisor.port}") as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service=SERVICE), timeout=30
            )
            seen = [(await watch.read()).status]
            calls = [asyncio.ensure_future(_sleep_call(channel)(b"4000")) for _ in range(5)]
            await asyncio.sleep(0.5)  # the calls are in flight
            supervisor.proc.send_signal(signal.SIGTERM)
            seen.append((await watch.read()).status)
            watch.cancel()
            closed_in_flight = False
            while not closed_in_flight and not all(call.done() for call in calls):
                closed_in_flight = not listening(supervisor.port)
                await asyncio.sleep(0.02)
            return list(await asyncio.gather(*calls)), seen, closed_in_flight

    answers, seen, closed_in_flight = asyncio.run(scenario())
    assert answers == [b"4000"] * 5
    assert seen == [
        health_pb2.HealthCheckResponse.SERVING,
        health_pb2.HealthCheckResponse.NOT_SERVING,
    ]
    assert closed_in_flight, "the port kept listening until the drain ended"
    assert supervisor.proc.wait(30) == 0
    assert b"worker draining" in supervisor.close()


@pytest.mark.parametrize("kind", SERVERS)
def test_a_worker_that_cannot_bind_stops_the_supervisor_with_an_error(kind: str) -> None:
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    port = blocker.getsockname()[1]  # bound without SO_REUSEPORT: nobody else may bind
    try:
        proc = subprocess.run(
            [sys.executable, "-c", SUPERVISOR, f"127.0.0.1:{port}", f"127.0.0.1:{free_port()}",
             kind, "2", "-"],
            capture_output=True,
            timeout=90,
            check=False,
        )  # fmt: skip
    finally:
        blocker.close()
    assert proc.returncode != 0
    assert b"worker failed during startup" in proc.stderr


def test_admin_calls_reach_a_real_worker_and_refusals_raise() -> None:
    """The drain's admin client against a real Envoy worker: a call Envoy
    takes returns its body; one it refuses raises instead of passing for done
    (an HTTP/1.0 request once got 426 and left every drain's port open)."""
    sup = Supervisor("envoy", workers=1)
    try:
        sup.wait_serving()
        (admin,) = sup.tmp.glob("meshplane-echo-*/admin-0.sock")
        assert b"grpc::" in admin_post(str(admin), "/listeners")
        with pytest.raises(AdminError, match="404"):
            admin_post(str(admin), "/no_such_endpoint")
    finally:
        sup.close()
