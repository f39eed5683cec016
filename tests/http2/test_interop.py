"""meshplane.servers.h2.http2.Connection against a real client: the ``h2`` library's
H2Connection, client side, byte for byte (no sockets)."""

from __future__ import annotations

import random

import h2.config
import h2.connection
import h2.events
import h2.settings

from meshplane.servers.h2.http2.connection import Connection, DataReceived, Event, RequestReceived
from meshplane.servers.h2.http2.hpack_blocks import RESPONSE_GRPC, TRAILERS_OK

REQUEST = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/pkg.Service/Method"),
    (":authority", "backend"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]


def grpc_message(payload: bytes) -> bytes:
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


class Pair:
    """A client H2Connection and our server Connection, wired by hand."""

    def __init__(self) -> None:
        self.client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.server = Connection()
        self.now = 0.0
        self.client.initiate_connection()

    def to_server(self) -> list[Event]:
        self.now += 0.001
        return self.server.receive(self.client.data_to_send(), self.now)

    def to_client(self) -> list[h2.events.Event]:
        return self.client.receive_data(self.server.data_to_send())


def test_unary_calls_on_one_connection() -> None:
    pair = Pair()
    assert pair.to_server() == []
    pair.to_client()
    for _ in range(3):
        stream_id = pair.client.get_next_available_stream_id()
        pair.client.send_headers(stream_id, REQUEST)
        pair.client.send_data(stream_id, grpc_message(b"ping"), end_stream=True)
        events = pair.to_server()
        assert [type(e) for e in events] == [RequestReceived, DataReceived]
        request, data = events
        assert isinstance(request, RequestReceived) and isinstance(data, DataReceived)
        assert (b":path", b"/pkg.Service/Method") in request.headers
        assert data == DataReceived(stream_id, grpc_message(b"ping"), True)
        pair.server.send_headers(stream_id, RESPONSE_GRPC)
        pair.server.send_data(stream_id, grpc_message(b"pong"))
        pair.server.send_headers(stream_id, TRAILERS_OK, end_stream=True)
        answer = pair.to_client()
        kinds = [type(e) for e in answer]
        assert kinds == [
            h2.events.ResponseReceived,
            h2.events.DataReceived,
            h2.events.TrailersReceived,
            h2.events.StreamEnded,
        ]
        assert isinstance(answer[1], h2.events.DataReceived)
        assert answer[1].data == grpc_message(b"pong")
        assert pair.server.active_streams == 0


def exchange(pair: Pair, stream_id: int, body: bytes) -> tuple[bytes, list[Event]]:
    """Send ``body`` as the request of ``stream_id``, as fast as the client's view of our
    windows allows; the server application acknowledges what it receives. The body the
    server got, and its events."""
    got = bytearray()
    events: list[Event] = []
    sent = 0
    ended = False
    for _ in range(10_000):
        window = min(
            pair.client.local_flow_control_window(stream_id),
            pair.client.max_outbound_frame_size,
            len(body) - sent,
        )
        if window > 0:
            pair.client.send_data(stream_id, body[sent : sent + window])
            sent += window
        elif sent == len(body) and not ended:
            pair.client.end_stream(stream_id)
            ended = True
        for event in pair.to_server():
            events.append(event)
            if isinstance(event, DataReceived):
                got += event.data
                pair.server.acknowledge(stream_id, len(event.data))
        pair.to_client()
        if ended:
            return bytes(got), events
    raise AssertionError("the request never finished")


def test_a_large_request_needs_our_window_updates() -> None:
    pair = Pair()
    pair.to_server()
    pair.to_client()
    body = bytes(range(251)) * 12_000  # 3 MB: three times our 1 MiB stream window
    stream_id = pair.client.get_next_available_stream_id()
    pair.client.send_headers(stream_id, REQUEST)
    got, events = exchange(pair, stream_id, body)
    assert got == body
    assert isinstance(events[-1], DataReceived) and events[-1].ended
    pair.server.send_headers(stream_id, RESPONSE_GRPC)
    pair.server.send_headers(stream_id, TRAILERS_OK, end_stream=True)
    kinds = [type(e) for e in pair.to_client()]
    assert h2.events.StreamEnded in kinds
    assert pair.server.active_streams == 0


def read_response(pair: Pair, stream_id: int) -> tuple[bytes, list[h2.events.Event]]:
    """The client reads and acknowledges (so it sends WINDOW_UPDATEs) until the stream ends."""
    body = bytearray()
    seen: list[h2.events.Event] = []
    for _ in range(10_000):
        for event in pair.to_client():
            seen.append(event)
            if isinstance(event, h2.events.DataReceived):
                body += event.data
                pair.client.acknowledge_received_data(event.flow_controlled_length, stream_id)
            if isinstance(event, h2.events.StreamEnded):
                return bytes(body), seen
        pair.to_server()
    raise AssertionError("the response never finished")


def test_a_large_response_waits_for_the_clients_window_updates() -> None:
    pair = Pair()
    pair.to_server()
    pair.to_client()
    stream_id = pair.client.get_next_available_stream_id()
    pair.client.send_headers(stream_id, REQUEST)
    pair.client.send_data(stream_id, grpc_message(b"give me a lot"), end_stream=True)
    pair.to_server()
    reply = grpc_message(bytes(range(256)) * 4_000)  # 1 MB against the client's 64 KiB
    pair.server.send_headers(stream_id, RESPONSE_GRPC)
    pair.server.send_data(stream_id, reply)
    pair.server.send_headers(stream_id, TRAILERS_OK, end_stream=True)
    assert pair.server.queued_bytes > 0
    body, seen = read_response(pair, stream_id)
    assert body == reply
    assert isinstance(seen[-2], h2.events.TrailersReceived)
    assert pair.server.queued_bytes == 0 and pair.server.active_streams == 0


def test_a_client_settings_change_mid_stream() -> None:
    """The client grows its stream window and frame size while our answer waits on them:
    the delta applies to the open stream (RFC 9113 6.9.2) and frames grow to the new size."""
    pair = Pair()
    pair.to_server()
    pair.to_client()
    stream_id = pair.client.get_next_available_stream_id()
    pair.client.send_headers(stream_id, REQUEST, end_stream=True)
    pair.to_server()
    reply = grpc_message(b"q" * 300_000)
    pair.server.send_headers(stream_id, RESPONSE_GRPC)
    pair.server.send_data(stream_id, reply)
    pair.server.send_headers(stream_id, TRAILERS_OK, end_stream=True)
    first = pair.to_client()
    assert sum(len(e.data) for e in first if isinstance(e, h2.events.DataReceived)) == 65_535
    pair.client.update_settings(
        {
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20,
            h2.settings.SettingCodes.MAX_FRAME_SIZE: 1 << 15,
        }
    )
    pair.client.increment_flow_control_window(1 << 20)  # the connection's too
    pair.to_server()
    wire = pair.server.data_to_send()
    # h2 applies a new MAX_FRAME_SIZE from the next receive_data call after the ACK (its
    # frame buffer's cap is set on entry), so the ACK goes in on its own.
    assert wire[3] == 0x4 and wire[4] == 0x1  # SETTINGS ACK first
    rest = pair.client.receive_data(wire[:9]) + pair.client.receive_data(wire[9:])
    sizes = [len(e.data) for e in rest if isinstance(e, h2.events.DataReceived)]
    assert sum(sizes) + 65_535 == len(reply)
    assert max(sizes) == 1 << 15
    assert any(isinstance(e, h2.events.StreamEnded) for e in rest)
    assert pair.server.active_streams == 0


def test_concurrent_streams_interleave_and_the_client_sees_no_violation() -> None:
    pair = Pair()
    pair.to_server()
    pair.to_client()
    ids = []
    for _ in range(20):
        stream_id = pair.client.get_next_available_stream_id()
        ids.append(stream_id)
        pair.client.send_headers(stream_id, REQUEST)
        pair.client.send_data(stream_id, grpc_message(b"x" * 1000), end_stream=True)
    events = pair.to_server()
    assert sum(isinstance(e, RequestReceived) for e in events) == 20
    for stream_id in ids:
        pair.server.send_headers(stream_id, RESPONSE_GRPC)
        pair.server.send_data(stream_id, grpc_message(b"y" * 20_000))
        pair.server.send_headers(stream_id, TRAILERS_OK, end_stream=True)
    ended: set[int] = set()
    for _ in range(1000):
        for event in pair.to_client():
            if isinstance(event, h2.events.DataReceived):
                pair.client.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            if isinstance(event, h2.events.StreamEnded):
                ended.add(event.stream_id)
        pair.to_server()
        if len(ended) == 20:
            break
    assert ended == set(ids)
    assert pair.server.active_streams == 0 and pair.server.queued_bytes == 0


def feed(client: h2.connection.H2Connection, wire: bytes) -> list[h2.events.Event]:
    """Our bytes to the client a frame at a time: h2 applies a MAX_FRAME_SIZE it
    advertised only from the receive_data call after the one carrying our ACK."""
    events: list[h2.events.Event] = []
    pos = 0
    while pos < len(wire):
        end = pos + 9 + int.from_bytes(wire[pos : pos + 3], "big")
        events += client.receive_data(wire[pos:end])
        pos = end
    return events


def _client_reads(
    client: h2.connection.H2Connection,
    data: bytes,
    received: dict[int, bytearray],
    open_ids: set[int],
    ended: set[int],
) -> None:
    """The client takes the server's bytes: bodies kept and credited, ends noted."""
    for h2_event in feed(client, data):
        if isinstance(h2_event, h2.events.DataReceived):
            received.setdefault(h2_event.stream_id, bytearray()).extend(h2_event.data)
            client.acknowledge_received_data(h2_event.flow_controlled_length, h2_event.stream_id)
        elif isinstance(h2_event, h2.events.StreamEnded | h2.events.StreamReset):
            open_ids.discard(h2_event.stream_id)
            if isinstance(h2_event, h2.events.StreamEnded):
                ended.add(h2_event.stream_id)


def test_random_conversations_never_break_the_clients_rules() -> None:
    """The h2 client checks everything we send (frame sizes, its windows, stream states)
    and raises on a violation: random settings, bodies, acknowledgements, resets and
    answer sizes, and every call still ends (answered or reset)."""
    for seed in range(40):
        rng = random.Random(seed)
        client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        client.initiate_connection()
        client.update_settings(
            {
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: rng.choice([1, 100, 65_535, 1 << 20]),
                h2.settings.SettingCodes.MAX_FRAME_SIZE: rng.choice([16_384, 20_000, 1 << 20]),
                h2.settings.SettingCodes.HEADER_TABLE_SIZE: rng.choice([0, 100, 4096]),
            }
        )
        server = Connection()
        now = 0.0
        open_ids: set[int] = set()
        answered: dict[int, bytes] = {}
        received: dict[int, bytearray] = {}
        ended: set[int] = set()  # answered in full (StreamEnded)

        for _ in range(200):
            now += 0.01
            action = rng.random()
            if action < 0.15 and len(open_ids) < 8:
                stream_id = client.get_next_available_stream_id()
                client.send_headers(stream_id, REQUEST)
                size = min(
                    rng.choice([5, 10, 5000, 70_000]), client.local_flow_control_window(stream_id)
                )
                body = grpc_message(b"r" * max(0, size - 5))[:size]
                step = client.max_outbound_frame_size
                for i in range(0, len(body), step):
                    client.send_data(stream_id, body[i : i + step])
                client.end_stream(stream_id)
                open_ids.add(stream_id)
            elif action < 0.2 and open_ids and rng.random() < 0.3:
                stream_id = rng.choice(sorted(open_ids))
                client.reset_stream(stream_id)
                open_ids.discard(stream_id)
            for event in server.receive(client.data_to_send(), now):
                if isinstance(event, DataReceived):
                    if rng.random() < 0.7:
                        server.acknowledge(event.stream_id, len(event.data))
                    if event.ended and event.stream_id not in answered:
                        reply = grpc_message(
                            bytes([event.stream_id % 256]) * rng.choice([0, 100, 40_000, 150_000])
                        )
                        answered[event.stream_id] = reply
                        server.send_headers(event.stream_id, RESPONSE_GRPC)
                        server.send_data(event.stream_id, reply)
                        server.send_headers(event.stream_id, TRAILERS_OK, end_stream=True)
            assert not server.terminated
            _client_reads(client, server.data_to_send(), received, open_ids, ended)
            if rng.random() < 0.05:
                client.update_settings(
                    {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: rng.choice([0, 1000, 1 << 20])}
                )
        for _ in range(200):  # let everything finish
            if not open_ids:
                break
            server.receive(client.data_to_send(), now)
            _client_reads(client, server.data_to_send(), received, open_ids, ended)
            if client.local_settings.initial_window_size == 0:
                client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 65_535})
        assert not open_ids, f"seed {seed}: calls never ended"
        assert ended, f"seed {seed}: no call was answered"
        for stream_id in ended:
            assert bytes(received.get(stream_id, b"")) == answered[stream_id]
