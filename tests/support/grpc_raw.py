"""gRPC methods called with raw bytes: no (de)serializer, so gRPC passes the bytes through.

grpc's stubs type ``channel.unary_unary(method)`` with no serializers as taking and
returning ``Never`` (nothing binds the request and response type variables). Tests
that send hand-made or deliberately broken messages use these instead, which name
what gRPC really does with no serializer: bytes in, bytes out.
"""

from __future__ import annotations

import grpc
import grpc.aio


def raw_unary(channel: grpc.Channel, method: str) -> grpc.UnaryUnaryMultiCallable[bytes, bytes]:
    """``method`` as a unary call taking and returning the serialized messages."""
    return channel.unary_unary(method)


def raw_stream(channel: grpc.Channel, method: str) -> grpc.StreamStreamMultiCallable[bytes, bytes]:
    """``method`` as a bidirectional stream of serialized messages."""
    return channel.stream_stream(method)


def raw_unary_aio(
    channel: grpc.aio.Channel, method: str
) -> grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]:
    """:func:`raw_unary` on an asyncio channel."""
    return channel.unary_unary(method)
