"""CPU of one unary gRPC exchange through meshplane.servers.h2.http2.Connection alone.

    uv run --frozen python bench/http2_core_cost.py [--count 20000] [--rounds 5]

The sans-IO core of the ``--server h2`` backend, without the event loop, the
socket or a handler: ``receive`` of a request's HEADERS (a block the header
cache knows, as Envoy's steady blocks are) + DATA(END_STREAM), the events
walked, ``send_headers`` (RESPONSE_GRPC), ``send_data``, ``send_headers``
(TRAILERS_OK, END_STREAM) and ``data_to_send``. Two shapes:

* ``one per read``: one request per ``receive``, one ``data_to_send`` per
  answer (a lone call: the gateway-like case);
* ``8 per read``: eight requests per ``receive`` and one ``data_to_send``
  for their eight answers (saturation, where reads carry several calls).

The client sends a connection WINDOW_UPDATE every 64 calls, as clients batch
theirs. Figures are process CPU µs per call, the median and the best of the
rounds (the best is the least disturbed by other processes on the CPU); the
whole ``h2`` server's no-op (``bench/h2_noop.py``) costs ~12 µs a call at
saturation, socket and loop included (docs/benchmarks.md), and this core's
budget is 5 µs.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import struct
import sys
import time

from meshplane.servers.h2.http2.connection import (
    PREFACE,
    Connection,
    DataReceived,
    RequestReceived,
)
from meshplane.servers.h2.http2.hpack_blocks import RESPONSE_GRPC, TRAILERS_OK, encode_headers

BLOCK = encode_headers(
    [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/envoy.service.auth.v3.Authorization/Check"),
        (b":authority", b"extauthz"),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        (b"grpc-timeout", b"200m"),
        (b"user-agent", b"envoy/1.40"),
    ]
)
MESSAGE = b"\x00" + (300).to_bytes(4, "big") + b"r" * 300  # a Check request's size
REPLY = b"\x00" + (40).to_bytes(4, "big") + b"a" * 40


def _frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    n = len(payload)
    return struct.pack(">BHBBI", n >> 16, n & 0xFFFF, kind, flags, stream_id) + payload


def _requests(count: int, per_read: int) -> list[bytes]:
    reads: list[bytes] = []
    batch: list[bytes] = []
    for i in range(count):
        stream_id = 2 * i + 1
        batch.append(_frame(1, 0x4, stream_id, BLOCK) + _frame(0, 0x1, stream_id, MESSAGE))
        if i % 64 == 63:
            batch.append(_frame(8, 0, 0, struct.pack(">I", 64 * (len(REPLY) + 50))))
        if len(batch) >= per_read:
            reads.append(b"".join(batch))
            batch = []
    if batch:
        reads.append(b"".join(batch))
    return reads


def _round(count: int, per_read: int) -> float:
    reads = _requests(count, per_read)
    conn = Connection()
    conn.receive(PREFACE + _frame(4, 0, 0, b""), 0.0)
    conn.data_to_send()
    sink = 0
    gc.collect()  # each round starts from the same heap
    start = time.process_time()
    now = 0.0
    for wire in reads:
        now += 0.0001
        for event in conn.receive(wire, now):
            if type(event) is DataReceived and event.ended:
                stream_id = event.stream_id
                conn.send_headers(stream_id, RESPONSE_GRPC)
                conn.send_data(stream_id, REPLY)
                conn.send_headers(stream_id, TRAILERS_OK, end_stream=True)
            elif type(event) is not RequestReceived:
                raise AssertionError(f"unexpected {event}")
        sink += len(conn.data_to_send())
    elapsed = time.process_time() - start
    if conn.active_streams or conn.terminated or sink < count * len(REPLY):
        raise AssertionError("not every call was answered")
    return elapsed / count * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
    for label, per_read in (("one per read", 1), ("8 per read", 8)):
        figures = [_round(args.count, per_read) for _ in range(args.rounds)]
        print(
            f"{label:>13}: {statistics.median(figures):.2f} µs/call median, "
            f"{min(figures):.2f} best (rounds: {', '.join(f'{f:.2f}' for f in figures)})",
            flush=True,
        )
    print(f"load average {os.getloadavg()[0]:.2f} after", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
