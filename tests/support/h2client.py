"""A raw HTTP/2 client (the ``h2`` library on a plain socket) for wire-level gRPC tests.

grpcio's client always frames, compresses and times out the proper way, so
it cannot send what a server must survive: a message split over several
DATA frames, a compressed flag with an unknown encoding, a body that stops
mid-message, a wrong content-type, a ``grpc-timeout`` the client does not
enforce itself, a stream reset while the server is working.
"""

from __future__ import annotations

import socket
import ssl
import time
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events


@dataclass
class H2Response:
    """What came back on one stream."""

    headers: dict[str, str] = field(default_factory=dict)
    data: bytes = b""
    trailers: dict[str, str] = field(default_factory=dict)
    reset: bool = False
    ended: bool = False

    @property
    def grpc_status(self) -> int | None:
        """From the trailers, or from the headers of a Trailers-Only answer."""
        raw = self.trailers.get("grpc-status", self.headers.get("grpc-status"))
        return None if raw is None else int(raw)

    @property
    def grpc_message(self) -> str:
        return self.trailers.get("grpc-message", self.headers.get("grpc-message", ""))


def frame(message: bytes, *, compressed: bool = False) -> bytes:
    return (b"\x01" if compressed else b"\x00") + len(message).to_bytes(4, "big") + message


class H2Client:
    """One connection; streams are sent and read one at a time."""

    def __init__(self, port: int, *, tls: ssl.SSLContext | None = None) -> None:
        raw = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock: socket.socket = (
            tls.wrap_socket(raw, server_hostname="localhost") if tls is not None else raw
        )
        self.conn = h2.connection.H2Connection(
            config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self.conn.initiate_connection()
        self._flush()

    def _flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def close(self) -> None:
        try:
            self.conn.close_connection()
            self._flush()
        except OSError:
            pass
        self.sock.close()

    def __enter__(self) -> H2Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(
        self,
        path: str,
        chunks: list[bytes],
        *,
        content_type: str = "application/grpc",
        extra: tuple[tuple[str, str], ...] = (),
        end: bool = True,
    ) -> int:
        """Send headers and each chunk as its own DATA frame; the stream id."""
        stream = self.conn.get_next_available_stream_id()
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "localhost"),
            ("content-type", content_type),
            ("te", "trailers"),
            *extra,
        ]
        self.conn.send_headers(stream, headers, end_stream=not chunks and end)
        self._flush()
        for index, chunk in enumerate(chunks):
            self.conn.send_data(stream, chunk, end_stream=end and index == len(chunks) - 1)
            self._flush()
            time.sleep(0.02)  # separate TCP writes, so the server really sees separate frames
        return stream

    def reset(self, stream: int) -> None:
        self.conn.reset_stream(stream, error_code=8)  # CANCEL
        self._flush()

    def read(self, stream: int, timeout: float = 30.0) -> H2Response:
        """Events until ``stream`` ends (or is reset), or ``timeout`` passes."""
        response = H2Response()
        deadline = time.monotonic() + timeout
        while not (response.ended or response.reset):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"stream {stream} did not end within {timeout}s")
            self.sock.settimeout(remaining)
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the server closed the connection")
            for event in self.conn.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    self.conn.acknowledge_received_data(
                        event.flow_controlled_length, event.stream_id
                    )
                if getattr(event, "stream_id", None) != stream:
                    continue
                if isinstance(event, h2.events.ResponseReceived):
                    response.headers = {str(k): str(v) for k, v in event.headers}
                elif isinstance(event, h2.events.DataReceived):
                    response.data += event.data
                elif isinstance(event, h2.events.TrailersReceived):
                    response.trailers = {str(k): str(v) for k, v in event.headers}
                elif isinstance(event, h2.events.StreamEnded):
                    response.ended = True
                elif isinstance(event, h2.events.StreamReset):
                    response.reset = True
            self._flush()
        return response

    def call(self, path: str, chunks: list[bytes], **kwargs: object) -> H2Response:
        stream = self.start(path, chunks, **kwargs)  # type: ignore[arg-type]
        return self.read(stream)
