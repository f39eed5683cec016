"""meshplane.http2.Connection against a real client: the ``h2`` library's
H2Connection, client side, byte for byte (no sockets)."""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events

from meshplane.http2.connection import Connection, DataReceived, Event, RequestReceived
from meshplane.http2.hpack_blocks import RESPONSE_GRPC, TRAILERS_OK

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
