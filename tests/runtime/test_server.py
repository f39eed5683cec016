"""The shared process model: health, reflection, workers, metrics, drain."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from meshplane.server import running
from tests.runtime.echo_app import SERVICE, EchoApp
from tests.support.net import free_port, wait_for_port


def _sleep_call(channel: grpc.aio.Channel) -> grpc.aio.UnaryUnaryMultiCallable:  # type: ignore[type-arg]
    return channel.unary_unary(f"/{SERVICE}/Sleep")


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


SUPERVISOR = textwrap.dedent(
    """
    import sys
    from meshplane.server import ServeOptions, serve
    from tests.runtime.echo_app import make_app
    sys.exit(serve(make_app, ServeOptions(listen=sys.argv[1], workers=2,
                   metrics_listen=sys.argv[2], grace_seconds=5.0), service="echo"))
    """
)


@pytest.fixture
def supervisor() -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    port, metrics_port = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, f"127.0.0.1:{port}", f"127.0.0.1:{metrics_port}"],
        stderr=subprocess.PIPE,
        cwd=os.getcwd(),
    )
    try:
        wait_for_port(port)
        wait_for_port(metrics_port)
        yield proc, port, metrics_port
    finally:
        if proc.poll() is None:
            proc.terminate()  # the workers drain and exit with it
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        proc.wait(10)
        assert proc.stderr is not None
        proc.stderr.close()


def _workers_of(supervisor: int) -> list[int]:
    """The spawned worker processes of a supervisor (not its resource tracker)."""
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == supervisor and b"spawn_main" in cmdline:
            pids.append(int(entry.name))
    return pids


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie may wait long for a reaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _metric_lines(metrics_port: int, name: str) -> list[str]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read()
    return [line for line in body.decode().splitlines() if line.startswith(name)]


def test_workers_share_the_port_and_metrics_cover_every_worker(
    supervisor: tuple[subprocess.Popen[bytes], int, int],
) -> None:
    _proc, port, metrics_port = supervisor

    async def calls() -> None:
        # Separate channels are separate connections, which SO_REUSEPORT
        # spreads over both workers.
        for _ in range(40):
            async with grpc.aio.insecure_channel(
                f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
            ) as channel:
                await _sleep_call(channel)(b"0")

    deadline = time.monotonic() + 30
    while True:
        asyncio.run(calls())
        lines = _metric_lines(metrics_port, "meshplane_test_echo_calls_total{")
        if len(lines) >= 2 or time.monotonic() > deadline:
            break
    assert len(lines) >= 2, f"expected calls on both workers, got {lines}"
    total = sum(float(line.rsplit(" ", 1)[1]) for line in lines)
    assert total % 40 == 0 and total >= 40


def test_workers_exit_when_the_supervisor_is_killed(
    supervisor: tuple[subprocess.Popen[bytes], int, int],
) -> None:
    """A supervisor killed outright cannot stop its workers; they notice that
    it is gone and drain and exit instead of serving on as orphans."""
    proc, port, _ = supervisor
    deadline = time.monotonic() + 30
    while len(workers := _workers_of(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(workers) == 2, workers
    proc.kill()
    proc.wait(10)
    deadline = time.monotonic() + 15
    while any(_running(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_running(pid) for pid in workers), "workers outlived their supervisor"
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_sigterm_drains_in_flight_calls_and_exits_zero(
    supervisor: tuple[subprocess.Popen[bytes], int, int],
) -> None:
    proc, port, _ = supervisor

    async def scenario() -> list[bytes]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            calls = [asyncio.ensure_future(_sleep_call(channel)(b"1500")) for _ in range(5)]
            await asyncio.sleep(0.5)  # the calls are in flight
            proc.send_signal(signal.SIGTERM)
            return list(await asyncio.gather(*calls))

    assert asyncio.run(scenario()) == [b"1500"] * 5
    assert proc.wait(15) == 0
    assert b"worker draining" in proc.stderr.read()  # type: ignore[union-attr]


def test_a_worker_that_cannot_bind_stops_the_supervisor_with_an_error() -> None:
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    port = blocker.getsockname()[1]  # bound without SO_REUSEPORT: nobody else may bind
    try:
        proc = subprocess.run(
            [sys.executable, "-c", SUPERVISOR, f"127.0.0.1:{port}", f"127.0.0.1:{free_port()}"],
            capture_output=True,
            timeout=60,
            check=False,
        )
    finally:
        blocker.close()
    assert proc.returncode != 0
    assert b"worker failed during startup" in proc.stderr
