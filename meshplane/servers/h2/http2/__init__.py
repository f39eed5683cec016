"""A pure (sans-IO) HTTP/2 server connection for the one-thread ``--server h2`` backend.

No asyncio, no sockets, no clock reads: bytes in (with the time), events and
bytes out. :mod:`.connection` enforces RFC 9113 against a hostile peer with
the caps of :mod:`.limits`; :mod:`.hpack_blocks` encodes response headers
without touching the peer's dynamic table.
"""
