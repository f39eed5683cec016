"""A one-thread h2c unary gRPC server on uvloop: how low can a Python server's floor go?

    uv run python bench/h2_floor.py --port 9500                       # the no-op
    uv run python bench/h2_floor.py --port 9500 --check CONFIG.yaml   # the real ext_authz Check

Issue 26, item 5 (docs/benchmarks.md): pyvoy hands every call from Envoy's
worker thread to a relay thread and on to the Python loop thread and back,
~7 thread wake-ups and ~14 system calls a call over native Envoy. This
prototype measures the alternative: one ``asyncio.Protocol`` on uvloop that
reads HTTP/2 frames off the socket itself and answers every complete request
in the same loop turn, so a call costs one ``epoll_wait`` wake-up, one
``read`` and one ``write`` and no thread hand-off at all.

What it does (HTTP/2 cleartext with prior knowledge, RFC 9113):

- the connection preface, SETTINGS (the peer's INITIAL_WINDOW_SIZE and
  MAX_FRAME_SIZE are honoured) and their ACK, PING ACK, WINDOW_UPDATE (the
  data it consumes is given back to the peer at once, the connection's and
  a still-open stream's; the peer's connection window bounds what it sends,
  and an answer that does not fit waits for the peer's WINDOW_UPDATE),
  RST_STREAM (the stream is forgotten), GOAWAY (the connection closes);
- HEADERS (+ CONTINUATION, padding and priority stripped) decoded with
  ``hpack.Decoder``, and a per-connection cache from header-block bytes to
  decoded headers. The cache is sound because it only keeps blocks whose
  decoding left the dynamic table exactly as it found it (no incremental
  indexing, no size update): such a block decodes to the same headers for
  as long as the table does not change, and is emptied whenever a block
  changes the table. Whether the table changed is judged from its size
  limit, its length and its newest entry *object* (held, so that its
  identity cannot be reused): every insertion puts a new tuple first;
- DATA, END_STREAM honoured: when a request's stream ends, the handler runs
  at once; a handler coroutine that finishes without suspending (the
  no-op, the Check's cache hits) is answered in the same loop turn, one
  that suspends is finished by a task;
- all the answers (and SETTINGS/PING ACKs, WINDOW_UPDATEs) a
  ``data_received`` produces go out in ONE ``transport.write``: HEADERS
  (``:status 200``, ``content-type: application/grpc``, a pre-encoded
  constant block), DATA (the framed reply), trailers HEADERS (pre-encoded
  ``grpc-status: 0``; a failure is a trailers-only answer with its code and
  ``grpc-message``).

Handlers: ``--check CONFIG`` the real ext_authz Check handler (built as
``bench/asgi_cost.py`` builds it: ``ExtAuthzApp`` + ``new_worker_context``,
the same ``bytes -> bytes`` coroutine ``meshplane/asgi_grpc.py`` calls);
otherwise a no-op answering ``--response-hex`` to any path, like
``bench/asgi_noop.py``.

What it does NOT do, and a production server must (a prototype to measure,
never to serve):

- TLS / ALPN (h2c with prior knowledge only), HTTP/1.1 or the upgrade;
- limits against hostile peers: header list size (hpack's default only),
  concurrent streams (none advertised, none enforced), rapid reset
  (CVE-2023-44487: RST_STREAM is free here), CONTINUATION flood
  (CVE-2024-27316: fragments are buffered without bound), frame size
  (larger frames than advertised are accepted), request body size, the
  header-block cache's size (bounded, but a peer can thrash it), idle and
  slow-read timeouts, write backpressure (``pause_writing`` is ignored);
- protocol conformance: stream state machine (id ordering, frames on
  closed or idle streams, PRIORITY, PUSH_PROMISE are not checked but
  ignored), per-stream send windows after the first answer (an answer
  larger than the peer's initial stream window is refused with RST_STREAM),
  SETTINGS_HEADER_TABLE_SIZE (it never indexes, so needs none), errors as
  GOAWAY with the right code (a malformed connection is simply closed);
- gRPC: ``grpc-timeout`` deadlines (a handler is never cancelled),
  compression (``grpc-encoding``), streaming RPCs, several messages, a
  message split over several DATA frames is assembled but not size-limited,
  metadata for handlers (tracing's ``traceparent``);
- graceful drain (GOAWAY then wait for calls in flight), signals beyond
  SIGTERM/SIGINT stopping at once, health and reflection services,
  several workers (SO_REUSEPORT processes), logs and metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import struct
import sys
from collections.abc import Awaitable, Callable, Generator
from pathlib import Path
from typing import Any, cast

import hpack
import uvloop

ROOT = Path(__file__).resolve().parents[1]

Handler = Callable[[bytes], Awaitable[bytes]]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 0x4, 0x5
_FRAME = struct.Struct(">BHBBI")  # length (24 bits as 8 + 16), type, flags, stream id
CACHE_LIMIT = 256  # header blocks kept per connection
#: Header blocks decoded by hpack and answered from the cache (``--stats``): hpack is
#: pure Python, ~22 µs for a 9-header block of indexed fields, the cache's hit ~0.05.
BLOCKS = {"decoded": 0, "cached": 0}


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    n = len(payload)
    return _FRAME.pack(n >> 16, n & 0xFFFF, kind, flags, stream) + payload


def _literal(name: bytes, value: bytes) -> bytes:
    """A literal header field without indexing, new name, no Huffman (RFC 7541 6.2.2):
    never touches the peer's dynamic table, so constant blocks stay valid forever."""
    return b"\x00" + _string(name) + _string(value)


def _string(data: bytes) -> bytes:
    n = len(data)
    if n < 127:
        return bytes([n]) + data
    out, n = bytearray([127]), n - 127
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out) + data


# :status 200 is static entry 8 (indexed: 0x88); content-type is static name 31.
RESPONSE_HEADERS = b"\x88" + b"\x0f\x10" + _string(b"application/grpc")
OK_TRAILERS = _literal(b"grpc-status", b"0")
_UNSUPPORTED = b"\x0f\x0d" + _string(b"415")  # :status is static name 8: literal, then 415


def _status_block(code: int, message: str) -> bytes:
    """Trailers-only answer: :status 200, content-type, grpc-status, grpc-message."""
    # gRPC's percent-encoding: the UTF-8 bytes outside printable ASCII, and '%'.
    text = "".join(
        chr(b) if 0x20 <= b <= 0x7E and b != 0x25 else f"%{b:02X}" for b in message.encode()
    )
    return (
        RESPONSE_HEADERS
        + _literal(b"grpc-status", str(code).encode())
        + _literal(b"grpc-message", text.encode("ascii"))
    )


def _self_check() -> None:
    """The hand-encoded constant blocks decode to what they claim (hpack agrees)."""
    decoded = hpack.Decoder().decode(RESPONSE_HEADERS + OK_TRAILERS, raw=True)
    expected = [
        (b":status", b"200"),
        (b"content-type", b"application/grpc"),
        (b"grpc-status", b"0"),
    ]
    if decoded != expected:
        raise AssertionError(f"constant header blocks decode to {decoded}")


class _Resume:
    """The rest of a handler coroutine that suspended on its first step, as an awaitable
    a task can drive (it passes the future the coroutine yielded on to the task)."""

    def __init__(self, coro: Any, pending: Any) -> None:
        self._coro, self._pending = coro, pending

    def __await__(self) -> Generator[Any, Any, bytes]:
        pending = self._pending
        while True:
            try:
                sent = yield pending
            except BaseException as exc:  # thrown into the coroutine
                try:
                    pending = self._coro.throw(exc)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]
            else:
                try:
                    pending = self._coro.send(sent)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]


class _Stream:
    __slots__ = ("block", "body", "headers")

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] | None = None
        self.block = bytearray()  # header fragments until END_HEADERS
        self.body = bytearray()


class H2Floor(asyncio.Protocol):
    """One client connection (see the module docstring for what it does and does not)."""

    def __init__(
        self, handlers: dict[str, Handler], default: Handler | None, cache_limit: int = CACHE_LIMIT
    ) -> None:
        self._handlers, self._default = handlers, default
        self._cache_limit = cache_limit
        self._buf = bytearray()
        self._preface = False
        self._streams: dict[int, _Stream] = {}
        self._decoder = hpack.Decoder()
        self._cache: dict[bytes, list[tuple[bytes, bytes]]] = {}
        self._table_mark: tuple[int, int, object] = self._mark()
        self._out: list[bytes] = []
        self._send_window = 65535  # the peer's connection window for our DATA
        self._stream_window = 65535  # the peer's initial window of each stream
        self._max_frame = 16384
        self._blocked: list[tuple[int, bytes, int]] = []  # (stream, answer, DATA bytes)
        self._continuing = 0  # stream whose header block awaits CONTINUATION
        self._ended = 0  # END_STREAM of the HEADERS frame that block began with
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast("asyncio.Transport", transport)  # uvloop's: no subclass
        # Our SETTINGS (all defaults) and a large connection window, so that a peer
        # sending many requests never waits on our WINDOW_UPDATEs.
        transport.write(
            frame(SETTINGS, 0, 0, b"") + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 24))
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._streams.clear()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos = 0
        if not self._preface:
            if len(buf) < len(PREFACE):
                return
            if buf[: len(PREFACE)] != PREFACE:
                self._close()
                return
            self._preface, pos = True, len(PREFACE)
        end = len(buf)
        consumed = 0  # DATA bytes to give back on the connection
        try:
            while end - pos >= 9:
                high, low, kind, flags, stream = _FRAME.unpack_from(buf, pos)
                length = (high << 16) | low
                if end - pos - 9 < length:
                    break
                payload = bytes(buf[pos + 9 : pos + 9 + length])
                pos += 9 + length
                stream &= 0x7FFFFFFF
                if kind == DATA:
                    consumed += length
                    self._data(stream, flags, payload)
                elif kind in (HEADERS, CONTINUATION):
                    self._headers(kind, stream, flags, payload)
                else:
                    self._control(kind, stream, flags, payload)
        except _ConnectionError:
            self._close()
            return
        del buf[:pos]
        if consumed:
            self._out.append(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", consumed)))
        self._flush()

    def _flush(self) -> None:
        if self._out and self.transport is not None:
            self.transport.write(b"".join(self._out))
        self._out.clear()

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _control(self, kind: int, stream: int, flags: int, payload: bytes) -> None:
        if kind == SETTINGS:
            if not flags & ACK:
                self._settings(payload)
                self._out.append(frame(SETTINGS, ACK, 0, b""))
        elif kind == PING:
            if not flags & ACK:
                self._out.append(frame(PING, ACK, 0, payload))
        elif kind == WINDOW_UPDATE:
            if stream == 0:
                self._send_window += int.from_bytes(payload[:4]) & 0x7FFFFFFF
                self._unblock()
        elif kind == RST_STREAM:
            self._streams.pop(stream, None)
        elif kind == GOAWAY:
            self._flush()
            self._close()
        # PRIORITY, PUSH_PROMISE (never sent by clients) and unknown frames: ignored.

    def _settings(self, payload: bytes) -> None:
        for offset in range(0, len(payload) - 5, 6):
            key, value = struct.unpack_from(">HI", payload, offset)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                self._stream_window = value
            elif key == SETTINGS_MAX_FRAME_SIZE:
                self._max_frame = value

    def _headers(self, kind: int, stream_id: int, flags: int, payload: bytes) -> None:
        if kind == HEADERS:
            if self._continuing:
                raise _ConnectionError
            start, stop = 0, len(payload)
            if flags & PADDED:
                start, stop = 1, stop - payload[0]
            if flags & PRIORITY_FLAG:
                start += 5
            stream = self._streams.get(stream_id)
            if stream is None:
                stream = self._streams[stream_id] = _Stream()
            stream.block += payload[start:stop]
            self._ended = flags & END_STREAM
        else:
            if stream_id != self._continuing:
                raise _ConnectionError
            # Reset meanwhile: the block is still decoded, to keep the decoder's state right.
            stream = self._streams.get(stream_id) or _Stream()
            stream.block += payload
        if not flags & END_HEADERS:
            self._continuing = stream_id
            return
        self._continuing = 0
        headers = self._decode(bytes(stream.block))
        stream.block.clear()
        if stream.headers is None:
            stream.headers = headers
        if self._ended and stream_id in self._streams:  # request (or trailers) end the stream
            self._complete(stream_id)

    def _mark(self) -> tuple[int, int, object]:
        table = self._decoder.header_table
        entries = table.dynamic_entries
        return table.maxsize, len(entries), entries[0] if entries else None

    def _decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        cached = self._cache.get(block)
        if cached is not None:
            BLOCKS["cached"] += 1
            return cached
        BLOCKS["decoded"] += 1
        try:
            headers: list[tuple[bytes, bytes]] = list(self._decoder.decode(block, raw=True))
        except hpack.HPACKError as exc:  # the decoder's state is lost: so is the connection
            raise _ConnectionError from exc
        mark = self._mark()
        if (
            mark[0] != self._table_mark[0]
            or mark[1] != self._table_mark[1]
            or mark[2] is not self._table_mark[2]
        ):
            self._cache.clear()  # the table changed: every kept decoding may be stale
            self._table_mark = mark
        elif len(self._cache) < self._cache_limit:
            self._cache[block] = headers
        return headers

    def _data(self, stream_id: int, flags: int, payload: bytes) -> None:
        stream = self._streams.get(stream_id)
        if stream is None:
            return  # reset or unknown: the connection window is still given back
        if flags & PADDED:
            payload = payload[1 : len(payload) - payload[0]]
        stream.body += payload
        if flags & END_STREAM:
            self._complete(stream_id)
        elif payload:
            self._out.append(frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">I", len(payload))))

    def _complete(self, stream_id: int) -> None:
        stream = self._streams.pop(stream_id)
        path = method = content_type = b""
        for name, value in stream.headers or ():
            if name == b":path":
                path = value
            elif name == b":method":
                method = value
            elif name == b"content-type":
                content_type = value
        if method != b"POST" or not content_type.startswith(b"application/grpc"):
            self._out.append(frame(HEADERS, END_HEADERS | END_STREAM, stream_id, _UNSUPPORTED))
            return
        handler = self._handlers.get(path.decode("latin-1"), self._default)
        body = stream.body
        if handler is None:
            self._status(stream_id, 12, f"Method not found: {path.decode('latin-1')}")
            return
        if len(body) < 5 or body[0] != 0 or int.from_bytes(body[1:5]) != len(body) - 5:
            self._status(stream_id, 13, "one uncompressed message expected")
            return
        coro = handler(bytes(body[5:]))
        try:
            pending = coro.send(None)  # type: ignore[attr-defined]
        except StopIteration as stop:
            self._answer(stream_id, stop.value)
            return
        except Exception as exc:  # the failure is the call's status
            self._failed(stream_id, exc)
            return
        task = asyncio.get_running_loop().create_task(self._finish(stream_id, coro, pending))
        task.add_done_callback(lambda _: self._flush())

    async def _finish(self, stream_id: int, coro: Any, pending: Any) -> None:
        try:
            reply = await _Resume(coro, pending)
        except Exception as exc:
            self._failed(stream_id, exc)
            return
        self._answer(stream_id, reply)

    def _failed(self, stream_id: int, exc: Exception) -> None:
        code = getattr(exc, "code", None)
        if isinstance(code, int):
            self._status(stream_id, int(code), str(getattr(exc, "message", "")) or str(exc))
        else:
            self._status(stream_id, 2, f"Unexpected {type(exc).__name__}")

    def _status(self, stream_id: int, code: int, message: str) -> None:
        block = _status_block(code, message)
        self._out.append(frame(HEADERS, END_HEADERS | END_STREAM, stream_id, block))

    def _answer(self, stream_id: int, reply: bytes) -> None:
        message = b"\x00" + len(reply).to_bytes(4) + reply
        size = len(message)
        if size > self._stream_window:
            self._out.append(frame(RST_STREAM, 0, stream_id, struct.pack(">I", 2)))
            return
        out = [frame(HEADERS, END_HEADERS, stream_id, RESPONSE_HEADERS)]
        step = self._max_frame
        out += [frame(DATA, 0, stream_id, message[i : i + step]) for i in range(0, size, step)]
        out.append(frame(HEADERS, END_HEADERS | END_STREAM, stream_id, OK_TRAILERS))
        answer = b"".join(out)
        if self._blocked or size > self._send_window:
            self._blocked.append((stream_id, answer, size))
            return
        self._send_window -= size
        self._out.append(answer)

    def _unblock(self) -> None:
        while self._blocked and self._blocked[0][2] <= self._send_window:
            _, answer, size = self._blocked.pop(0)
            self._send_window -= size
            self._out.append(answer)


class _ConnectionError(Exception):
    """A connection-level protocol error: the connection is closed."""


async def _check_handlers(config: str) -> tuple[dict[str, Handler], Any]:
    """The real ext_authz Check, built as bench/asgi_cost.py builds it."""
    sys.path.insert(0, str(ROOT))
    from extauthz.app import ExtAuthzApp  # noqa: PLC0415
    from meshplane.server_contract import new_worker_context  # noqa: PLC0415

    ext = ExtAuthzApp(config)
    ctx = new_worker_context(ext)
    await ext.start(ctx)
    return dict(ctx.services.methods), ext


async def _serve(args: argparse.Namespace) -> None:
    _self_check()
    handlers: dict[str, Handler] = {}
    default: Handler | None = None
    app = None
    if args.check:
        handlers, app = await _check_handlers(args.check)
    else:
        reply = bytes.fromhex(args.response_hex)[5:]  # the framed answer, as asgi_noop takes it

        async def noop(_: bytes) -> bytes:
            return reply

        default = noop
    loop = asyncio.get_running_loop()
    limit = 0 if args.no_header_cache else CACHE_LIMIT
    server = await loop.create_server(
        lambda: H2Floor(handlers, default, limit), args.host, args.port
    )
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()
    if args.stats:
        print(f"header blocks: {BLOCKS['decoded']} decoded, {BLOCKS['cached']} cached", flush=True)
    if app is not None:
        await app.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--response-hex", default="0000000000", help="the no-op's framed answer")
    parser.add_argument("--check", metavar="CONFIG", help="serve the real ext_authz Check")
    parser.add_argument(
        "--no-header-cache", action="store_true", help="decode every header block with hpack"
    )
    parser.add_argument("--stats", action="store_true", help="print the header blocks' counts")
    uvloop.run(_serve(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
