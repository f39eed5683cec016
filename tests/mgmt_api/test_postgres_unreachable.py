"""A PostgreSQL that never answers: connection attempts give up, they do not hang.

The stand-in is a real TCP listener that never accepts: the kernel completes
the handshake and buffers what libpq sends, and nothing ever replies (a
blackholed or wedged database host looks the same). Without a connect
timeout libpq would wait for the kernel's TCP timeout, minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from mgmt_api.store.engine import create_engine
from mgmt_api.store.notify import listen_revisions
from tests.support.processes import eventually


@pytest.fixture
def silent_listener_fake_postgres() -> Iterator[int]:
    """A port whose listener never accepts or answers: the fake, named as such."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()[1]


def test_a_database_that_never_answers_fails_the_connection_attempt(
    silent_listener_fake_postgres: int,
) -> None:
    port = silent_listener_fake_postgres
    engine = create_engine(f"postgresql+psycopg://meshplane@127.0.0.1:{port}/meshplane")
    outcome: list[BaseException | None] = []

    def connect() -> None:
        try:
            with engine.connect():
                outcome.append(None)
        except BaseException as exc:  # what the attempt ended with, whatever it is
            outcome.append(exc)

    attempt = threading.Thread(target=connect, daemon=True)
    attempt.start()
    attempt.join(60)  # the default timeout is 5 s: 60 means it hangs
    engine.dispose()
    assert outcome, "the connection attempt was still waiting after 60 s"
    assert isinstance(outcome[0], sa.exc.OperationalError), outcome
    assert "timeout" in str(outcome[0]).lower(), outcome


async def test_the_replica_listener_gives_up_and_tries_again(
    silent_listener_fake_postgres: int, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"postgresql+psycopg://meshplane@127.0.0.1:{silent_listener_fake_postgres}/meshplane"
    listener = asyncio.create_task(listen_revisions(url, lambda _revision: None))
    try:
        await eventually(
            lambda: "revision listener lost its connection" in caplog.text,
            60,
            "the listener's connection attempt to give up",
        )
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
