"""A stand-in for ``loop.create_connection`` that hands the store's RESP protocol a
fake Redis transport: the CPU benches time the real store stack, not a socket."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, TypeVar

_P = TypeVar("_P", bound=asyncio.BaseProtocol)


class CreateConnection(Protocol):
    """``loop.create_connection``'s shape, as far as the store calls it."""

    async def __call__(
        self, protocol_factory: Callable[[], _P], *args: object, **kwargs: object
    ) -> tuple[asyncio.Transport, _P]: ...


def fake_connection(
    transport: Callable[[asyncio.Protocol], asyncio.Transport],
) -> CreateConnection:
    """``loop.create_connection``'s stand-in: every connection is ``transport(protocol)``."""

    async def create_connection(
        protocol_factory: Callable[[], _P], *_: object, **__: object
    ) -> tuple[asyncio.Transport, _P]:
        protocol = protocol_factory()
        assert isinstance(protocol, asyncio.Protocol)  # the store's RESP protocol
        fake = transport(protocol)
        protocol.connection_made(fake)
        return fake, protocol

    return create_connection
