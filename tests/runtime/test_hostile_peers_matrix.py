"""The hostile-peer table on every backend: the same verdict from each.

Each attacker runs on its own raw socket against one echo worker; whatever
codec answers it (Envoy's or h2's), the server ends the attacker's connection
within a deadline and the next, well-behaved client is served. The codes and
counters each backend uses are its own (h2's in test_h2_backend.py); the
verdict here is what a caller of either backend can rely on. The memory side
of hostile peers is test_memory_bounds.py, also on every backend.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Iterator

import grpc
import h2.config
import h2.connection
import pytest

from tests.runtime.echo_app import SERVICE
from tests.runtime.supervisors import SERVERS, Supervisor
from tests.support.grpc_raw import raw_unary

SLEEP = f"/{SERVICE}/Sleep"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
PING = b"\x00\x00\x08\x06\x00\x00\x00\x00\x00" + b"12345678"
#: A loaded 2-core machine: generous, and still far below a client's patience.
CUT_OFF_SECONDS = 30


@pytest.fixture(scope="module", params=SERVERS)
def server(request: pytest.FixtureRequest) -> Iterator[Supervisor]:
    sup = Supervisor(request.param, workers=1)
    try:
        sup.wait_serving()
        yield sup
    finally:
        sup.close()


def _closed_by_server(sock: socket.socket) -> bool:
    """Read (and drop) what the server sends until it closes; False if it never does."""
    deadline = time.monotonic() + CUT_OFF_SECONDS
    sock.settimeout(1)
    while time.monotonic() < deadline:
        try:
            if not sock.recv(65536):
                return True
        except TimeoutError:
            continue
        except OSError:  # a reset: closed as well
            return True
    return False


def _garbage_preface(sock: socket.socket) -> None:
    sock.sendall(b"GET / HTTP/1.1\r\nHost: example\r\n\r\n")


def _rapid_reset(sock: socket.socket) -> None:
    """CVE-2023-44487: streams opened and cancelled at once, thousands of them."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    headers = [(":method", "POST"), (":scheme", "http"), (":path", SLEEP),
               (":authority", "localhost"), ("content-type", "application/grpc")]  # fmt: skip
    for _ in range(3000):
        stream = client.get_next_available_stream_id()
        client.send_headers(stream, headers)
        client.reset_stream(stream, 8)  # CANCEL
    with contextlib.suppress(OSError):  # it may hang up while we still send
        sock.sendall(client.data_to_send())


def _ping_flood_never_reading(sock: socket.socket) -> None:
    """CVE-2019-9512: PINGs whose ACKs the peer never reads."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(PREFACE + EMPTY_SETTINGS)
    burst = PING * 4096
    deadline = time.monotonic() + CUT_OFF_SECONDS
    with contextlib.suppress(OSError):  # the server gives up: a reset or a send timeout
        while time.monotonic() < deadline:
            sock.sendall(burst)


def _settings_flood(sock: socket.socket) -> None:
    """SETTINGS frames (each one owed an ACK) far faster than any client sends them."""
    settings = b"\x00\x00\x06\x04\x00\x00\x00\x00\x00" + b"\x00\x03\x00\x00\x00\x64"
    sock.sendall(PREFACE + EMPTY_SETTINGS)
    with contextlib.suppress(OSError):
        sock.sendall(settings * 20_000)


ATTACKS: dict[str, Callable[[socket.socket], None]] = {
    "garbage preface": _garbage_preface,
    "rapid reset": _rapid_reset,
    "PING flood, never reading": _ping_flood_never_reading,
    "SETTINGS flood": _settings_flood,
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_the_attacker_is_cut_off_and_the_next_client_served(
    server: Supervisor, attack: str
) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        ATTACKS[attack](sock)
        assert _closed_by_server(sock), f"{server.kind} kept the {attack} connection open"
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        assert raw_unary(channel, SLEEP)(b"0", timeout=30) == b"0"
