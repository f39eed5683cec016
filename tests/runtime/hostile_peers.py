"""Hostile peers that cost a worker memory, a well-behaved victim, and a worker's meter.

Shared by tests/runtime/test_memory_bounds.py (which asserts the bounds) and
bench/hostile_peers.py (which prints the figures): the attack is written once.
The attackers speak raw HTTP/2 through the ``h2`` library, so they can do what
no gRPC client does (shut their windows, hold a body unfinished); the victim is
grpcio's client, calling ``grpc.health.v1.Health/Check`` on its own connection.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from meshplane.aio import wait_event
from tests.support.grpc_raw import raw_unary

REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
MIB = 1 << 20


def _frame(message: bytes) -> bytes:
    return b"\x00" + len(message).to_bytes(4, "big") + message


#: Two reflection requests, each a few dozen bytes: a file every service uses
#: (its answer ~1.5 KB) and one that no echo service uses (~14 KB if served).
USED_FILE_REQUEST = _frame(
    reflection_pb2.ServerReflectionRequest(
        file_containing_symbol="grpc.reflection.v1alpha.ServerReflection"
    ).SerializeToString()
)
REFLECTION_REQUESTS = USED_FILE_REQUEST + _frame(
    reflection_pb2.ServerReflectionRequest(
        file_by_filename="google/protobuf/descriptor.proto"
    ).SerializeToString()
)


def _headers(path: str) -> list[tuple[str, str]]:
    return [(":method", "POST"), (":scheme", "http"), (":path", path),
            (":authority", "localhost"), ("content-type", "application/grpc"),
            ("te", "trailers")]  # fmt: skip


# ---- the worker's meter --------------------------------------------------------------


def rss(pid: int) -> int:
    """Resident bytes of a process (0 once it is gone)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime, stime in clock ticks (USER_HZ)


def worker_pid(supervisor_pid: int, timeout: float = 60) -> int:
    """The supervisor's one worker: its biggest child (a spawned worker has a small
    resource-tracker sibling)."""
    deadline = time.monotonic() + timeout
    path = Path(f"/proc/{supervisor_pid}/task/{supervisor_pid}/children")
    while True:
        pids = [int(pid) for pid in path.read_text().split()]
        if pids:
            return max(pids, key=rss)
        if time.monotonic() > deadline:
            raise TimeoutError("the supervisor has no worker")
        time.sleep(0.05)


class Meter:
    """Samples a process's resident memory in a thread; keeps the peak."""

    def __init__(self, pid: int, every: float = 0.02) -> None:
        self.pid = pid
        self.every = every
        self.peak = self.now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def now(self) -> int:
        return rss(self.pid)

    def __enter__(self) -> Meter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.peak = max(self.peak, self.now())


def settle(pid: int, below: Callable[[int], bool], timeout: float = 60) -> int:
    """Until ``below(rss)`` holds (memory given back); the last reading."""
    deadline = time.monotonic() + timeout
    while True:
        now = rss(pid)
        if below(now) or time.monotonic() > deadline:
            return now
        time.sleep(0.1)


def quiet(pid: int, window: float = 1.0, busy: float = 0.2, timeout: float = 60) -> float:
    """Seconds until the process spends under ``busy`` of a CPU over ``window``
    (the worker stopped working for a peer that left); inf if it never does."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        used = cpu_seconds(pid)
        time.sleep(window)
        if (cpu_seconds(pid) - used) / window < busy:
            return time.monotonic() - start - window
    return float("inf")


# ---- the victim ----------------------------------------------------------------------


@dataclass
class Victim:
    """A well-behaved client: Health/Check in a loop on its own connection, timed."""

    port: int
    latencies: list[float] = field(default_factory=list)
    failures: collections.Counter[str] = field(default_factory=collections.Counter)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Victim:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        request = health_pb2.HealthCheckRequest().SerializeToString()
        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            check = raw_unary(channel, HEALTH_CHECK)
            while not self._stop.is_set():
                start = time.perf_counter()
                try:
                    check(request, timeout=30)
                except grpc.RpcError as exc:
                    self.failures[exc.code().name] += 1
                self.latencies.append(time.perf_counter() - start)
                self._stop.wait(0.01)

    def p99(self) -> float:
        """The 99th percentile latency in seconds (inf without calls)."""
        if len(self.latencies) < 2:
            return float("inf")
        return statistics.quantiles(self.latencies, n=100)[98]


# ---- the attackers -------------------------------------------------------------------


async def _open(port: int, **settings: int) -> tuple[
    asyncio.StreamReader, asyncio.StreamWriter, h2.connection.H2Connection
]:  # fmt: skip
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    if settings:
        conn.update_settings({getattr(h2.settings.SettingCodes, k): v for k, v in settings.items()})
    writer.write(conn.data_to_send())
    await writer.drain()
    return reader, writer, conn


@dataclass
class FloodResult:
    sent: int = 0  # request bytes the worker let us send
    seconds: float = 0.0


async def reflection_flood(port: int, seconds: float, max_bytes: int) -> FloodResult:
    """One ServerReflectionInfo stream, our window zero (no answer byte can reach us),
    sending small requests as fast as the worker's windows let us, for ``seconds``
    or ``max_bytes``; then the connection is dropped."""
    reader, writer, conn = await _open(port, INITIAL_WINDOW_SIZE=0)
    stream = conn.get_next_available_stream_id()
    conn.send_headers(stream, _headers(REFLECTION))
    # The first request alone (a first DATA frame of several is refused as pipelined).
    first = USED_FILE_REQUEST
    conn.send_data(stream, first)
    result = FloodResult(sent=len(first))
    start = time.monotonic()
    unit = len(REFLECTION_REQUESTS)
    chunk = REFLECTION_REQUESTS * (8192 // unit)
    credit, answered = asyncio.Event(), asyncio.Event()

    async def read() -> None:  # everything is read; no window is ever granted
        while data := await reader.read(1 << 16):
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    answered.set()
            credit.set()

    reading = asyncio.ensure_future(read())
    try:
        writer.write(conn.data_to_send())
        # The rest once the first is answered (else it is refused as pipelined).
        async with asyncio.timeout(30):
            await answered.wait()
        while time.monotonic() - start < seconds and result.sent < max_bytes:
            room = min(conn.local_flow_control_window(stream), len(chunk))
            if room < unit:
                credit.clear()
                await wait_event(credit, 0.2)
                if reading.done():
                    break
                continue
            size = room - room % unit
            conn.send_data(stream, chunk[:size])
            result.sent += size
            writer.write(conn.data_to_send())
            await writer.drain()
    except (ConnectionError, h2.exceptions.ProtocolError):
        pass
    finally:
        result.seconds = time.monotonic() - start
        reading.cancel()
        writer.transport.abort()
    return result


@dataclass
class HoldResult:
    holding: int = 0  # streams whose unfinished body the worker took, or refused
    cut_off: int = 0  # connections the worker ended (GOAWAY or closed)
    refused: int = 0  # streams the worker reset or answered before the body ended


async def _hold_one(
    port: int, streams: int, body: bytes, result: HoldResult, release: asyncio.Event
) -> None:
    try:
        reader, writer, conn = await _open(port)
    except ConnectionError:  # refused at once (the worker sheds connections)
        result.cut_off += 1
        return
    left: dict[int, memoryview] = {}
    for _ in range(streams):
        stream = conn.get_next_available_stream_id()
        conn.send_headers(stream, _headers("/meshplane.test.Echo/Echo"))
        left[stream] = memoryview(body)
    credit = asyncio.Event()
    ended = False

    async def read() -> None:
        nonlocal ended
        while data := await reader.read(1 << 16):
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ConnectionTerminated):
                    ended = True
                elif isinstance(event, (h2.events.StreamReset, h2.events.StreamEnded)):
                    # Reset, or answered (an error) before the body ended.
                    result.refused += 1
                    left.pop(event.stream_id, None)
            credit.set()
        ended = True
        credit.set()

    reading = asyncio.ensure_future(read())
    try:
        while left and not ended and not release.is_set():
            sent = 0
            for stream, unsent in list(left.items()):
                room = min(conn.local_flow_control_window(stream), len(unsent), 1 << 18)
                step = conn.max_outbound_frame_size
                for at in range(0, room, step):
                    conn.send_data(stream, unsent[at : min(at + step, room)].tobytes())
                sent += room
                if room < len(unsent):
                    left[stream] = unsent[room:]
                else:
                    del left[stream]
            writer.write(conn.data_to_send())
            await writer.drain()
            if not sent:  # the worker's windows are shut: until it opens them
                credit.clear()
                waiting = asyncio.ensure_future(release.wait())
                await asyncio.wait({waiting, asyncio.ensure_future(credit.wait())},
                                   return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
                waiting.cancel()
        if not left and not ended:
            result.holding += streams
        while not ended and not release.is_set():  # hold, until told or cut off
            credit.clear()
            waiting = asyncio.ensure_future(release.wait())
            await asyncio.wait({waiting, asyncio.ensure_future(credit.wait())},
                               return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
            waiting.cancel()
        if ended:
            result.cut_off += 1
    except (ConnectionError, h2.exceptions.ProtocolError, h2.exceptions.StreamClosedError):
        result.cut_off += 1
    finally:
        reading.cancel()
        writer.transport.abort()


async def held_bodies(
    port: int,
    connections: int,
    streams: int,
    body_bytes: int,
    until: Callable[[HoldResult], bool],
    timeout: float,
) -> HoldResult:
    """``connections`` connections of ``streams`` streams each sending a gRPC message
    announced at 4 MiB but sending only ``body_bytes`` of it, never ending; held
    until ``until(result)`` holds or ``timeout`` passes, then all dropped."""
    body = b"\x00" + (4 * MIB).to_bytes(4, "big") + bytes(body_bytes - 5)
    result = HoldResult()
    release = asyncio.Event()
    tasks = [
        asyncio.ensure_future(_hold_one(port, streams, body, result, release))
        for _ in range(connections)
    ]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not until(result):
        if all(task.done() for task in tasks):
            break
        await asyncio.sleep(0.05)
    release.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    return result
