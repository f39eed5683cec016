"""Hostile h2 clients that cost memory, over real sockets, against one echo worker.

Each case is a hole the red-team pass found open (docs/runtime.md, "Hostile
peers"): it measured the worker's RSS climbing by half a gigabyte from one
connection. The cases check that the bound now holds and how the attacker is
answered; the other hostile peers (rapid reset, PING flood, slowloris, ...) are
in test_h2_backend.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest

from tests.runtime.echo_app import SERVICE
from tests.runtime.supervisors import Supervisor

ENHANCE_YOUR_CALM = 11
#: The stall timeout short, so that the zero-window case ends in seconds.
ENV = {"MESHPLANE_H2_SEND_STALL_SECONDS": "2"}


@pytest.fixture(scope="module")
def server() -> Iterator[Supervisor]:
    sup = Supervisor("h2", workers=1, env=ENV)
    try:
        sup.wait_serving()
        yield sup
    finally:
        sup.close()


def _headers(method: str) -> list[tuple[str, str]]:
    return [(":method", "POST"), (":scheme", "http"), (":path", f"/{SERVICE}/{method}"),
            (":authority", "localhost"), ("content-type", "application/grpc"),
            ("te", "trailers")]  # fmt: skip


def _client(**settings: int) -> h2.connection.H2Connection:
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    if settings:
        client.update_settings(
            {getattr(h2.settings.SettingCodes, k): v for k, v in settings.items()}
        )
    return client


def test_a_peer_that_keeps_its_windows_shut_is_closed_with_enhance_your_calm(
    server: Supervisor,
) -> None:
    """Zero-window: it reads everything but grants no window, and asks for 4 MiB
    answers; they wait in the worker until MESHPLANE_H2_SEND_STALL_SECONDS, then
    the connection ends with GOAWAY(ENHANCE_YOUR_CALM) (before: held for the
    connection's whole life, 566 MiB from 128 such calls)."""
    client = _client(INITIAL_WINDOW_SIZE=0)
    for _ in range(4):
        stream = client.get_next_available_stream_id()
        client.send_headers(stream, _headers("Fill"))
        client.send_data(stream, b"\x00\x00\x00\x00\x07" + b"4194304", end_stream=True)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        start = time.monotonic()
        sock.sendall(client.data_to_send())
        goaway = None
        while chunk := sock.recv(1 << 16):
            for event in client.receive_data(chunk):
                if isinstance(event, h2.events.ConnectionTerminated):
                    goaway = event.error_code
        elapsed = time.monotonic() - start
    assert goaway == ENHANCE_YOUR_CALM
    assert 1.5 < elapsed < 20


def test_bodies_over_the_connections_cap_reset_the_stream_that_crosses_it(
    server: Supervisor,
) -> None:
    """Five streams each sending an unfinished 4 MiB message: the worker would
    hold all of them (128 of them: 606 MiB). The stream whose DATA takes the
    connection's open bodies over 16 MiB is reset ENHANCE_YOUR_CALM; the others,
    and the connection, go on."""
    client = _client()
    streams = []
    for _ in range(5):
        streams.append(client.get_next_available_stream_id())
        client.send_headers(streams[-1], _headers("Echo"))
    total = 4 * 1024 * 1024
    sent = dict.fromkeys(streams, 0)
    resets: dict[int, int] = {}
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(client.data_to_send())
        deadline = time.monotonic() + 20
        while not resets and time.monotonic() < deadline:
            moved = True
            while moved:  # everything the windows allow, then read what they say
                moved = False
                for stream in streams:
                    room = min(
                        client.local_flow_control_window(stream),
                        client.max_outbound_frame_size,
                        total - sent[stream],
                    )
                    if room > 0:
                        prefix = struct.pack(">BI", 0, total) if not sent[stream] else b""
                        client.send_data(stream, (prefix + b"a" * room)[:room])
                        sent[stream] += room
                        moved = True
            sock.sendall(client.data_to_send())
            for event in client.receive_data(sock.recv(1 << 16)):
                if isinstance(event, h2.events.StreamReset):
                    resets[event.stream_id] = event.error_code
                assert not isinstance(event, h2.events.ConnectionTerminated)
        assert list(resets.values()) == [ENHANCE_YOUR_CALM]
        assert sum(sent.values()) > 16 * 1024 * 1024
        client.ping(b"stillup!")
        sock.sendall(client.data_to_send())
        acked = False
        while not acked:
            for event in client.receive_data(sock.recv(1 << 16)):
                acked = acked or isinstance(event, h2.events.PingAckReceived)
