"""What one HTTP/2 server connection allows its peer, and why each default.

Every input a peer controls has a cap here (the developers' guide: every input
has a size cap). The advertised ones go out in our SETTINGS and are enforced
on receipt; the flood budgets follow Envoy's ``http2_protocol_options``
defaults, which answer CVE-2019-9512..9518 (ping, reset, settings, empty-frame,
priority and window-update floods, the "data dribble" of a peer that does not
read) and CVE-2023-44487 (rapid reset). :mod:`meshplane.servers.h2.http2.connection` says
which error each cap answers with.
"""

from __future__ import annotations

from dataclasses import dataclass

#: RFC 9113 6.5.2: the smallest and largest SETTINGS_MAX_FRAME_SIZE.
MIN_MAX_FRAME_SIZE = 1 << 14
MAX_MAX_FRAME_SIZE = (1 << 24) - 1
#: RFC 9113 6.9.1: a flow-control window never exceeds 2^31-1.
MAX_WINDOW = (1 << 31) - 1
#: RFC 9113 6.9.2: every window starts at 65,535 until SETTINGS change it.
DEFAULT_WINDOW = 65_535


@dataclass(frozen=True, slots=True)
class ResetBudget:
    """A token bucket for streams the peer opens and resets before we answer them.

    Rapid reset (CVE-2023-44487) costs the peer two frames and us a handler
    run each; a legitimate client cancels a call now and then. One token per
    such stream, refilled at ``per_second`` up to ``burst``; an empty bucket
    closes the connection (GOAWAY ENHANCE_YOUR_CALM). Streams *we* reset for
    a peer's malformed frames are charged too ("MadeYouReset", CVE-2025-8671:
    the same amplification through our own RST_STREAMs). The defaults let a
    client cancel 200 calls a second forever, or 256 at once: twice the 128
    calls it may have open, so cancelling all of them at once never costs its
    connection. Not more: each such stream costs a header block decoded (an
    attacker defeats the block cache by indexing), ~50 µs, and a peer that
    reconnects gets a full bucket each time. Measured with ``burst`` 1,000: a
    reconnecting rapid-reset client took a worker's whole CPU in 55 ms runs,
    and a steady client's p50 from 1 ms to 35 ms (docs/runtime.md).
    """

    per_second: float = 200.0
    burst: int = 256

    def __post_init__(self) -> None:
        if not self.per_second > 0:
            raise ValueError(f"reset budget per_second must be > 0, not {self.per_second}")
        if self.burst < 1:
            raise ValueError(f"reset budget burst must be >= 1, not {self.burst}")


@dataclass(frozen=True, slots=True)
class Limits:
    """One connection's caps; validated at construction so a bad value fails at startup."""

    #: Advertised SETTINGS_MAX_CONCURRENT_STREAMS and enforced (REFUSED_STREAM beyond
    #: it): bounds the requests (and their handlers) one connection holds at once; a
    #: client wanting more waits, or opens another connection. 128 calls in flight
    #: keep a saturated worker busy (the benches peak at 8 per connection).
    max_concurrent_streams: int = 128
    #: Advertised SETTINGS_MAX_FRAME_SIZE; a bigger inbound frame is FRAME_SIZE_ERROR.
    #: The RFC's minimum: one frame is buffered whole before it is parsed.
    max_frame_size: int = MIN_MAX_FRAME_SIZE
    #: Advertised SETTINGS_MAX_HEADER_LIST_SIZE (RFC 7541 size: name + value + 32 per
    #: field). Envoy's own default request header limit is 60 KiB; a gRPC call carries
    #: well under 1 KiB, so 16 KiB leaves room for large tokens.
    max_header_list_bytes: int = 16_384
    #: Compressed bytes of one HEADERS + CONTINUATION block: without it a CONTINUATION
    #: flood (CVE-2024-27316) is buffered without end. Twice the list cap: a block of
    #: literals is never much bigger than the list it decodes to.
    max_header_block_bytes: int = 32_768
    #: Request DATA bytes per stream: gRPC's default maximum received message (4 MiB)
    #: plus its 5-byte frame prefix.
    max_body_bytes: int = 4 * 1024 * 1024 + 5
    #: Request DATA bytes of all the connection's open streams together (counted until
    #: the stream closes: a gRPC server holds a request's message until it answers).
    #: Without it 128 streams x ``max_body_bytes`` pin 512 MiB per connection (the
    #: windows bound only what is not yet acknowledged). The stream whose DATA crosses
    #: it is reset ENHANCE_YOUR_CALM (RESOURCE_EXHAUSTED): four full gRPC messages
    #: at once, as ``max_queued_response_bytes`` on the answers' side.
    max_connection_body_bytes: int = 16 * 1024 * 1024
    #: Our SETTINGS_INITIAL_WINDOW_SIZE: a 1 MiB request flows without waiting for our
    #: WINDOW_UPDATE. At least 65,535 (the RFC default), so a peer that sends before it
    #: has our SETTINGS never overruns a window we shrank.
    stream_window: int = 1 << 20
    #: Our connection receive window: the request bytes handed to the application and
    #: not yet acknowledged never exceed it (the memory a connection can make us hold).
    connection_window: int = 4 << 20
    #: The header-block cache (block bytes -> decoded headers), per connection, in
    #: bytes of keys plus values: hpack decodes ~20 µs a block, the cache answers a
    #: repeated block in well under 1 µs; 64 KiB holds hundreds of typical blocks.
    header_cache_bytes: int = 64 * 1024
    #: PING and SETTINGS ACKs and RST_STREAMs that the peer made us queue and that
    #: ``data_to_send`` has not taken yet (Envoy's max_outbound_control_frames): a
    #: peer that floods PINGs while not reading our answers is cut off.
    max_outbound_control_frames: int = 1000
    #: Consecutive inbound DATA/HEADERS/CONTINUATION frames with an empty payload and
    #: no END_STREAM (Envoy's max_consecutive_inbound_frames_with_empty_payload): they
    #: cost us a frame's work and carry nothing (CVE-2019-9518).
    max_empty_frames: int = 1
    #: PRIORITY frames allowed per opened stream (plus one stream's worth), over the
    #: connection's life (Envoy's max_inbound_priority_frames_per_stream, CVE-2019-9513).
    max_priority_frames_per_stream: int = 100
    #: WINDOW_UPDATEs allowed per DATA frame we sent (Envoy's
    #: max_inbound_window_update_frames_per_data_frame_sent, CVE-2019-9517).
    max_window_updates_per_data_frame: int = 10
    #: Rapid reset (CVE-2023-44487), see :class:`ResetBudget`.
    reset_budget: ResetBudget = ResetBudget()
    #: Settings in one SETTINGS frame (nghttp2's limit after CVE-2020-11080: a frame of
    #: thousands cost a parse each). The RFC defines 6 (9 with extensions); a peer
    #: repeating them has no use for more.
    max_settings_entries: int = 32

    def __post_init__(self) -> None:
        _at_least("max_concurrent_streams", self.max_concurrent_streams, 1)
        if not MIN_MAX_FRAME_SIZE <= self.max_frame_size <= MAX_MAX_FRAME_SIZE:
            raise ValueError(
                f"max_frame_size must be in [{MIN_MAX_FRAME_SIZE}, {MAX_MAX_FRAME_SIZE}], "
                f"not {self.max_frame_size}"
            )
        _at_least("max_header_list_bytes", self.max_header_list_bytes, 1)
        _at_least("max_header_block_bytes", self.max_header_block_bytes, 1)
        _at_least("max_body_bytes", self.max_body_bytes, 0)
        _at_least("max_connection_body_bytes", self.max_connection_body_bytes, 0)
        for name, value in (
            ("stream_window", self.stream_window),
            ("connection_window", self.connection_window),
        ):
            if not DEFAULT_WINDOW <= value <= MAX_WINDOW:
                raise ValueError(f"{name} must be in [{DEFAULT_WINDOW}, {MAX_WINDOW}], not {value}")
        _at_least("header_cache_bytes", self.header_cache_bytes, 0)
        _at_least("max_outbound_control_frames", self.max_outbound_control_frames, 1)
        _at_least("max_empty_frames", self.max_empty_frames, 0)
        _at_least("max_priority_frames_per_stream", self.max_priority_frames_per_stream, 0)
        _at_least("max_window_updates_per_data_frame", self.max_window_updates_per_data_frame, 0)
        _at_least("max_settings_entries", self.max_settings_entries, 6)


def _at_least(name: str, value: int, minimum: int) -> None:
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, not {value}")


DEFAULT_LIMITS = Limits()
