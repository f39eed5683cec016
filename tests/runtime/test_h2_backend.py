"""``--server h2`` end to end: real processes, real sockets, real clients.

What the shared runtime tables (test_transports, test_server, test_tls, all
parametrized over every server) do not cover: large messages both ways
through HTTP/2 flow control, many calls at once on one connection, the
hostile peers the socket side must cut off (a garbage preface, no preface at
all, rapid reset, a frame left unfinished, an idle connection, a PING flood from a peer
that never reads, a peer that stops reading its answer, connections over
the worker's cap) with the metrics that
count them, and the two services as
deployed: a real Envoy's ext_authz filter calling ``extauthz serve --server
h2`` (``ratelimit serve --server h2`` on a real redis-server runs the whole
ShouldRateLimit table in tests/ratelimit/test_transports.py).

One echo supervisor (one worker, short timeouts) serves the module's echo
cases.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import struct
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import h2.config
import h2.connection
import h2.settings
import pytest

from tests.extauthz.cases import GOOD, NOW
from tests.extauthz.jwtkit import HS_SECRET, OTHER_SECRET, claims, make_token
from tests.extauthz.policies import write_policies
from tests.runtime.echo_app import SERVICE
from tests.runtime.supervisors import Supervisor
from tests.support.envoy import EnvoyProcess, ext_authz_gateway_bootstrap
from tests.support.grpc_raw import raw_unary, raw_unary_aio
from tests.support.net import free_port
from tests.support.processes import Service

ECHO = f"/{SERVICE}/Echo"
SLEEP = f"/{SERVICE}/Sleep"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
GOAWAY, PING = 7, 6
PROTOCOL_ERROR, ENHANCE_YOUR_CALM, NO_ERROR = 1, 11, 0
#: Short enough for the hostile cases to end fast, long enough for a loaded machine.
TIMEOUTS = {
    "MESHPLANE_H2_HANDSHAKE_SECONDS": "1",
    "MESHPLANE_H2_FRAME_SECONDS": "1",
    "MESHPLANE_H2_IDLE_SECONDS": "2",
    "MESHPLANE_H2_MAX_CONNECTIONS": "24",
    "MESHPLANE_H2_SEND_STALL_SECONDS": "3",
}
CAP = 24


@pytest.fixture(scope="module")
def server() -> Iterator[Supervisor]:
    sup = Supervisor("h2", workers=1, env=TIMEOUTS)
    try:
        sup.wait_serving()
        yield sup
    finally:
        sup.close()


def _metric(server: Supervisor, line_start: str) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5)
    for line in body.read().decode().splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {line_start}")


def _wait_metric(server: Supervisor, line_start: str, minimum: float) -> float:
    """Metrics are flushed once a second: poll until the count is there."""
    deadline = time.monotonic() + 15
    while (value := _metric(server, line_start)) < minimum:
        assert time.monotonic() < deadline, f"{line_start} stayed at {value}"
        time.sleep(0.2)
    return value


def _frames_until_close(sock: socket.socket, timeout: float = 10) -> list[tuple[int, int, bytes]]:
    """Every frame (type, flags, payload) the server sends until it closes."""
    sock.settimeout(timeout)
    data = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    else:
        raise AssertionError("the server kept the connection open")
    frames = []
    while len(data) >= 9:
        length = int.from_bytes(data[:3], "big")
        frames.append((data[3], data[4], data[9 : 9 + length]))
        data = data[9 + length :]
    return frames


def _goaway_code(frames: list[tuple[int, int, bytes]]) -> int | None:
    for kind, _, payload in frames:
        if kind == GOAWAY:
            return int(struct.unpack(">I", payload[4:8])[0])
    return None


# ---- gRPC through grpcio's client --------------------------------------------------------


def test_unary_calls_statuses_and_many_at_once_on_one_channel(server: Supervisor) -> None:
    async def scenario() -> list[bytes]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            sleep = raw_unary_aio(channel, SLEEP)
            assert await sleep(b"1", timeout=10) == b"1"
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await sleep(b"fail:no", timeout=10)
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert caught.value.details() == "no"
            # More calls than the 128 streams a connection may have open at once.
            calls = [sleep(str(i % 50).encode(), timeout=30) for i in range(300)]
            return list(await asyncio.gather(*calls))

    assert asyncio.run(scenario()) == [str(i % 50).encode() for i in range(300)]


def test_three_megabytes_each_way_through_flow_control(server: Supervisor) -> None:
    """Larger than every initial window (ours: 1 MiB a stream; the client's:
    64 KiB): both sides must give credit back for the call to finish."""
    message = os.urandom(3 * 1024 * 1024)
    options = [("grpc.max_receive_message_length", 8 << 20)]
    with grpc.insecure_channel(f"127.0.0.1:{server.port}", options=options) as channel:
        echo = raw_unary(channel, ECHO)
        for _ in range(2):  # the second on a connection whose windows were used
            assert echo(message, timeout=30) == message


# ---- hostile peers on raw sockets --------------------------------------------------------


def test_a_garbage_preface_gets_goaway_protocol_error_and_close(server: Supervisor) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: example\r\n\r\n")
        frames = _frames_until_close(sock)
    assert _goaway_code(frames) == PROTOCOL_ERROR, frames


def test_silent_slow_and_idle_peers_are_closed(server: Supervisor) -> None:
    """No preface within the handshake timeout; a frame header left unfinished
    (slowloris); a connection with no stream past the idle timeout (GOAWAY
    NO_ERROR). All three at once, each on its own connection."""
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as silent,
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as slow,
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as idle,
    ):
        slow.sendall(PREFACE + EMPTY_SETTINGS + b"\x00\x00\x08\x06")  # half a PING's header
        idle.sendall(PREFACE + EMPTY_SETTINGS)
        started = time.monotonic()
        silent_frames = _frames_until_close(silent)
        slow_frames = _frames_until_close(slow)
        idle_frames = _frames_until_close(idle)
        took = time.monotonic() - started
    assert _goaway_code(silent_frames) is not None, silent_frames
    assert _goaway_code(slow_frames) not in (None, NO_ERROR), slow_frames
    assert _goaway_code(idle_frames) == NO_ERROR, idle_frames
    assert took < 9


def test_rapid_reset_gets_goaway_enhance_your_calm(server: Supervisor) -> None:
    """CVE-2023-44487: streams opened and reset at once, far more than a
    client cancels; the connection ends with GOAWAY(ENHANCE_YOUR_CALM) and
    the worker serves the next client."""
    calm = 'meshplane_h2_connection_ends_total{code="ENHANCE_YOUR_CALM"}'
    before = _metric(server, calm)
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    headers = [(":method", "POST"), (":scheme", "http"), (":path", SLEEP),
               (":authority", "localhost"), ("content-type", "application/grpc")]  # fmt: skip
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        for _ in range(3000):
            stream = client.get_next_available_stream_id()
            client.send_headers(stream, headers)
            client.reset_stream(stream, 8)  # CANCEL
        with contextlib.suppress(OSError):  # it may hang up while we still send
            sock.sendall(client.data_to_send())
        frames = _frames_until_close(sock)
    # The GOAWAY itself may be lost to the reset our unread input causes: the
    # metric says which code ended the connection.
    assert _goaway_code(frames) in (None, ENHANCE_YOUR_CALM), frames[-3:]
    _wait_metric(server, calm, before + 1)
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        assert raw_unary(channel, SLEEP)(b"0", timeout=10) == b"0"


def test_a_ping_flood_from_a_peer_that_never_reads_is_cut_off(server: Supervisor) -> None:
    before = _metric(server, 'meshplane_h2_connection_ends_total{code="ENHANCE_YOUR_CALM"}')
    ping = b"\x00\x00\x08\x06\x00\x00\x00\x00\x00" + b"12345678"
    burst = ping * 4096
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(PREFACE + EMPTY_SETTINGS)
        deadline = time.monotonic() + 20
        with pytest.raises(OSError):  # reset (or a send timeout) once the server gives up
            while time.monotonic() < deadline:
                sock.sendall(burst)
    _wait_metric(server, 'meshplane_h2_connection_ends_total{code="ENHANCE_YOUR_CALM"}', before + 1)
    # The worker is fine: the next client is served.
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        assert raw_unary(channel, SLEEP)(b"0", timeout=10) == b"0"


def test_a_peer_that_stops_reading_is_cut_off(server: Supervisor) -> None:
    """It opens every window wide, asks for 16 MB and reads nothing: the server
    stops writing (and reading) once its buffers are full, and drops the
    connection when the peer stays stuck (MESHPLANE_H2_SEND_STALL_SECONDS)."""
    before = _metric(server, 'meshplane_h2_connection_ends_total{code="CANCEL"}')
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1})
    client.increment_flow_control_window(2**30)
    for _ in range(4):  # 16 MB: more than the kernel's socket buffers take
        stream = client.get_next_available_stream_id()
        client.send_headers(
            stream,
            [(":method", "POST"), (":scheme", "http"), (":path", f"/{SERVICE}/Fill"),
             (":authority", "localhost"), ("content-type", "application/grpc"),
             ("te", "trailers")],
        )  # fmt: skip
        client.send_data(stream, b"\x00\x00\x00\x00\x07" + b"4000000", end_stream=True)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    with sock:
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(client.data_to_send())
        _wait_metric(server, 'meshplane_h2_connection_ends_total{code="CANCEL"}', before + 1)
        received = 0
        with contextlib.suppress(OSError):  # the end: a reset, or EOF
            while chunk := sock.recv(1 << 20):
                received += len(chunk)
    assert received < 4 * 4_000_000  # what it had not read by then is gone


def _refused(sock: socket.socket) -> bool:
    """Closed at once (no SETTINGS), or served (the server's SETTINGS arrive)."""
    sock.settimeout(10)
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True


def test_connections_over_the_worker_cap_are_closed_at_once(server: Supervisor) -> None:
    before = _metric(server, "meshplane_h2_connections_refused_total")
    socks = []
    try:
        for _ in range(CAP + 4):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            socks.append(sock)
            sock.sendall(PREFACE + EMPTY_SETTINGS)
        refused = [_refused(sock) for sock in socks]
    finally:
        for sock in socks:
            sock.close()
    assert sum(refused) >= 4 and len(refused) - sum(refused) <= CAP, refused
    _wait_metric(server, "meshplane_h2_connections_refused_total", before + 4)
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        assert raw_unary(channel, SLEEP)(b"0", timeout=10) == b"0"


def test_metrics_count_connections_and_streams(server: Supervisor) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        for _ in range(3):
            raw_unary(channel, SLEEP)(b"0", timeout=10)
    _wait_metric(server, "meshplane_h2_streams_total", 3)
    _wait_metric(server, "meshplane_h2_connections_opened_total", 1)
    assert _metric(server, 'meshplane_h2_stream_resets_total{code="REFUSED_STREAM"}') >= 0


# ---- the services as deployed --------------------------------------------------------------


def _status_through(port: int, token: str) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/headers", headers={"Authorization": f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_envoy_ext_authz_through_extauthz_on_h2(tmp_path: Path) -> None:
    """A real Envoy's ext_authz filter (Envoy's own gRPC client) asks ``extauthz
    serve --server h2``: a valid token passes, a forged one gets 403."""

    config = write_policies(tmp_path)
    authz_port, gateway_port = free_port(), free_port()
    service = Service(
        ["extauthz.cli", "serve", "--config", str(config), "--server", "h2",
         "--listen", f"127.0.0.1:{authz_port}"],
        authz_port,
        tmp_path / "extauthz.log",
        env={**os.environ, "EXTAUTHZ_TEST_SECRET": HS_SECRET.decode()},
    ).start()  # fmt: skip
    envoy = EnvoyProcess(json.dumps(ext_authz_gateway_bootstrap(authz_port, gateway_port)))
    try:
        envoy.start()
        forged = make_token(claims(NOW), key=OTHER_SECRET)
        assert _status_through(gateway_port, GOOD) == 200
        assert _status_through(gateway_port, forged) == 403
    finally:
        envoy.stop()
        assert service.stop() == 0
