"""Revisions committed by other replicas, heard through PostgreSQL ``LISTEN``.

Every write transaction on PostgreSQL sends ``NOTIFY meshplane_revision,
'<revision>'`` (:mod:`mgmt_api.store.uow`); PostgreSQL delivers it to every
listening session when, and only if, that transaction commits. Each replica
keeps one dedicated connection listening and hands each revision to its
policy streams, so a write on one replica reaches the streams of all of them
in milliseconds instead of at the next poll.

The listening connection can drop (a failover, a restart, an idle-session
killer). The listener reconnects with capped backoff, and after every
(re)connect reports the stored revision once, which covers whatever was
committed while it was not listening. A slow poll stays behind it as a safety
net (:mod:`mgmt_api.distribution.hub`).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable

import psycopg
from sqlalchemy.engine import make_url

from mgmt_api.store.engine import postgres_connect_args

log = logging.getLogger(__name__)

REVISION_CHANNEL = "meshplane_revision"
#: The mesh's endpoint registry moved (mgmt_api.store.sidecars): not a configuration
#: revision, so it wakes only the sidecar streams.
SIDECARS_CHANNEL = "meshplane_sidecars"

_BACKOFF_FIRST = 0.2
_BACKOFF_MAX = 10.0


def libpq_url(sqlalchemy_url: str) -> str:
    """``postgresql+psycopg://...`` as the plain URL libpq (psycopg) connects with."""
    url = make_url(sqlalchemy_url).set(drivername="postgresql")
    return url.render_as_string(hide_password=False)


async def listen_revisions(
    sqlalchemy_url: str,
    on_revision: Callable[[int], None],
    *,
    connected: Callable[[], None] | None = None,
    channel: str = REVISION_CHANNEL,
) -> None:
    """Call ``on_revision`` for every committed revision, from any replica; cancel to stop.

    ``channel``: another channel whose payloads are integers (:data:`SIDECARS_CHANNEL`).

    ``connected`` runs after each successful ``LISTEN`` (the caller reads the
    stored revision then, covering the time it was not listening).
    """
    conninfo = libpq_url(sqlalchemy_url)
    delay = _BACKOFF_FIRST
    while True:
        try:
            conn = await psycopg.AsyncConnection.connect(
                conninfo, autocommit=True, **postgres_connect_args(sqlalchemy_url)
            )
            async with conn:
                await conn.execute(f"LISTEN {channel}")
                log.info("listening for other replicas' commits", extra={"channel": channel})
                delay = _BACKOFF_FIRST
                if connected is not None:
                    connected()
                async for notice in conn.notifies():
                    try:
                        on_revision(int(notice.payload))
                    except ValueError:
                        log.warning("ignored a malformed revision notice")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning(
                "revision listener lost its connection; reconnecting",
                extra={"error": type(exc).__name__, "retryInSeconds": round(delay, 2)},
            )
        await asyncio.sleep(delay * (0.5 + random.random()))  # noqa: S311 - jitter, not crypto
        delay = min(_BACKOFF_MAX, delay * 2)
