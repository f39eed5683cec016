"""The h2 backend's connection timeouts as a table: state and clock in, verdict out
(and their settings, from the environment).

``timeout_verdict`` is pure (the clock is an argument), so each rule is one
row: which timeout fires at ``now``, with which GOAWAY code, or when to look
again. The socket side of the same rules runs end to end in test_h2_backend.
"""

from __future__ import annotations

import pytest

from meshplane.servers.h2.http2.connection import (
    CANCEL,
    ENHANCE_YOUR_CALM,
    NO_ERROR,
    PROTOCOL_ERROR,
)
from meshplane.servers.h2.protocol import ConnectionTimes, H2Settings, Verdict, timeout_verdict
from meshplane.servers.h2.server import settings_from_env

SETTINGS = H2Settings(
    handshake_seconds=10,
    idle_seconds=300,
    frame_seconds=30,
    send_stall_seconds=60,
    max_age_seconds=600,
    max_age_grace_seconds=30,
)
#: A connection opened at 0 that has done its handshake and has a stream open.
BUSY = ConnectionTimes(
    opened_at=0.0,
    handshaken=True,
    write_paused_at=None,
    partial_since=None,
    block_since=None,
    idle_since=None,
)

CASES = [
    # (name, state, now, verdict)
    (
        "busy: look again when an idle period could end",
        BUSY,
        5.0,
        Verdict("wait", next_check=305.0),
    ),
    ("no preface yet", BUSY._replace(handshaken=False), 9.9, Verdict("wait", next_check=10.0)),
    (
        "no preface in 10 s",
        BUSY._replace(handshaken=False),
        10.0,
        Verdict("close", PROTOCOL_ERROR, "no preface within the handshake timeout"),
    ),
    (
        "a frame unfinished for 30 s (slowloris)",
        BUSY._replace(partial_since=70.0),
        100.0,
        Verdict("close", ENHANCE_YOUR_CALM, "frame or header block unfinished too long"),
    ),
    (
        "a header block unfinished for 30 s",
        BUSY._replace(block_since=1.0),
        31.5,
        Verdict("close", ENHANCE_YOUR_CALM, "frame or header block unfinished too long"),
    ),
    (
        "a frame unfinished for 20 s",
        BUSY._replace(partial_since=80.0),
        100.0,
        Verdict("wait", next_check=110.0),
    ),
    (
        "the peer has not read for 60 s",
        BUSY._replace(write_paused_at=40.0),
        100.0,
        Verdict("abort", CANCEL, "the peer does not read"),
    ),
    (
        "answers have waited on shut windows for 59 s",
        BUSY._replace(window_stall_since=41.0),
        100.0,
        Verdict("wait", next_check=101.0),
    ),
    (
        "answers have waited on shut windows for 60 s (zero-window peer)",
        BUSY._replace(window_stall_since=40.0),
        100.0,
        Verdict("close", ENHANCE_YOUR_CALM, "the peer keeps its windows shut"),
    ),
    (
        "shut windows and a peer that does not read either: aborted, its GOAWAY would not go",
        BUSY._replace(window_stall_since=40.0, write_paused_at=40.0),
        100.0,
        Verdict("abort", CANCEL, "the peer does not read"),
    ),
    (
        "the peer does not read and no preface either: the handshake is checked first",
        BUSY._replace(handshaken=False, write_paused_at=0.0),
        60.0,
        Verdict("close", PROTOCOL_ERROR, "no preface within the handshake timeout"),
    ),
    ("idle for 299 s", BUSY._replace(idle_since=1.0), 300.0, Verdict("wait", next_check=301.0)),
    ("idle for 300 s", BUSY._replace(idle_since=1.0), 301.0, Verdict("close", NO_ERROR, "idle")),
    (
        "no stream, but answers wait for a peer that does not read: not idle",
        BUSY._replace(idle_since=1.0, write_paused_at=290.0),
        310.0,
        Verdict("wait", next_check=350.0),
    ),
    (
        "at the maximum age: GOAWAY, look again at the end of its grace",
        BUSY,
        600.0,
        Verdict("drain", NO_ERROR, "maximum connection age", 630.0),
    ),
    (
        "past the maximum age and its grace: closed",
        BUSY,
        630.0,
        Verdict("close", NO_ERROR, "maximum connection age"),
    ),
    (
        "idle after the maximum age: closed as idle, before the grace ends",
        BUSY._replace(idle_since=290.0),
        610.0,
        Verdict("close", NO_ERROR, "idle"),
    ),
]


@pytest.mark.parametrize(("name", "state", "now", "expected"), CASES, ids=[c[0] for c in CASES])
def test_timeout_verdict(name: str, state: ConnectionTimes, now: float, expected: Verdict) -> None:
    assert timeout_verdict(now, state, SETTINGS) == expected


@pytest.mark.parametrize(
    "field", ["handshake_seconds", "idle_seconds", "frame_seconds", "max_age_seconds"]
)
def test_settings_refuse_a_timeout_that_is_not_positive(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        H2Settings(**{field: 0})  # type: ignore[arg-type]


def test_settings_from_the_environment() -> None:
    settings = settings_from_env(
        {"MESHPLANE_H2_IDLE_SECONDS": "2.5", "MESHPLANE_H2_MAX_CONNECTIONS": "7", "OTHER": "x"}
    )
    assert (settings.idle_seconds, settings.max_connections) == (2.5, 7)
    assert settings.handshake_seconds == H2Settings().handshake_seconds
    with pytest.raises(ValueError, match="MESHPLANE_H2_FRAME_SECONDS='soon' is not a number"):
        settings_from_env({"MESHPLANE_H2_FRAME_SECONDS": "soon"})
    with pytest.raises(ValueError, match=r"MESHPLANE_H2_.*idle_seconds must be positive"):
        settings_from_env({"MESHPLANE_H2_IDLE_SECONDS": "-1"})
