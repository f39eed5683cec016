"""The mesh CA rotation's state machine, row by row (:mod:`mgmt_api.domain.ca_rotation`)."""

from __future__ import annotations

import pytest

from mgmt_api.distribution.hub import mesh_ca_settle
from mgmt_api.domain import ca_rotation as cr
from mgmt_api.domain.ca_rotation import Event, Phase, Progress, Rotation, SigningRecord
from mgmt_api.errors import ApiError
from mgmt_api.settings import Settings

T0 = 1_000_000.0
IDLE = Rotation()
TRUSTING = Rotation(Phase.TRUSTING, since=T0, started=T0)
SIGNING = Rotation(Phase.SIGNING, since=T0 + 30, started=T0)
DONE = Rotation(Phase.DONE, since=T0 + 60, started=T0)
S = cr.SETTLE


def _p(sidecars: int, in_phase: int, not_new: int, last: float = 0.0) -> Progress:
    return Progress(sidecars, in_phase, not_new, last)


@pytest.mark.parametrize(
    ("state", "event", "now", "progress", "expected"),
    [
        # idle and done: a start begins trusting now; a tick changes nothing.
        (IDLE, Event.START, T0, Progress(), Rotation(Phase.TRUSTING, T0, T0)),
        (IDLE, Event.TICK, T0, _p(3, 0, 3), IDLE),
        (DONE, Event.START, T0 + 99, Progress(), Rotation(Phase.TRUSTING, T0 + 99, T0 + 99)),
        (DONE, Event.TICK, T0 + 99, _p(3, 3, 0), DONE),
        # trusting: every sidecar re-issued with the bundle, then settled: signing.
        (TRUSTING, Event.TICK, T0 + S, _p(2, 2, 2, T0 + 1), TRUSTING),  # last one not settled
        (
            TRUSTING,
            Event.TICK,
            T0 + 1 + S,
            _p(2, 2, 2, T0 + 1),
            Rotation(Phase.SIGNING, T0 + 1 + S, T0),
        ),
        (TRUSTING, Event.TICK, T0 + S, _p(0, 0, 0), Rotation(Phase.SIGNING, T0 + S, T0)),  # none
        (TRUSTING, Event.TICK, T0 + S - 1, _p(0, 0, 0), TRUSTING),
        # ... one not yet: wait, but never past TRUST_WAIT.
        (TRUSTING, Event.TICK, T0 + 60, _p(3, 2, 3, T0 + 1), TRUSTING),
        (
            TRUSTING,
            Event.TICK,
            T0 + cr.TRUST_WAIT,
            _p(3, 2, 3, T0 + 1),
            Rotation(Phase.SIGNING, T0 + cr.TRUST_WAIT, T0),
        ),
        # signing: done once no live certificate is of another CA, settled.
        (SIGNING, Event.TICK, T0 + 60, _p(3, 3, 1, T0 + 35), SIGNING),
        (SIGNING, Event.TICK, T0 + 40, _p(3, 3, 0, T0 + 35), SIGNING),  # not settled
        (SIGNING, Event.TICK, T0 + 45, _p(3, 3, 0, T0 + 35), Rotation(Phase.DONE, T0 + 45, T0)),
        (SIGNING, Event.TICK, T0 + 30 + S, _p(0, 0, 0), Rotation(Phase.DONE, T0 + 30 + S, T0)),
        (SIGNING, Event.TICK, T0 + 9_999, _p(3, 0, 1, T0 + 35), SIGNING),  # no timeout here
    ],
)
def test_the_table(
    state: Rotation, event: Event, now: float, progress: Progress, expected: Rotation
) -> None:
    assert cr.step(state, event, now, progress) == expected


@pytest.mark.parametrize("state", [TRUSTING, SIGNING])
def test_a_second_start_while_one_runs_is_refused(state: Rotation) -> None:
    with pytest.raises(cr.RotationRunning, match=state.phase.value):
        cr.step(state, Event.START, T0 + 5)


def test_a_configured_settle_time_replaces_the_default() -> None:
    """``MESHPLANE_MESH_CA_SETTLE``: both phases wait that long after their last certificate."""
    ready = _p(2, 2, 2, T0 + 1)
    assert cr.step(TRUSTING, Event.TICK, T0 + 3, ready, settle=2) == Rotation(
        Phase.SIGNING, T0 + 3, T0
    )
    assert cr.step(TRUSTING, Event.TICK, T0 + 2.9, ready, settle=2) == TRUSTING
    done = _p(3, 3, 0, T0 + 35)
    assert cr.step(SIGNING, Event.TICK, T0 + 37, done, settle=2) == Rotation(
        Phase.DONE, T0 + 37, T0
    )
    assert cr.step(SIGNING, Event.TICK, T0 + 36.9, done, settle=2) == SIGNING


@pytest.mark.parametrize(("value", "seconds"), [("1s", 1.0), ("10s", 10.0), ("5m", 300.0)])
def test_the_settle_setting_is_read_within_its_bounds(value: str, seconds: float) -> None:
    assert mesh_ca_settle(Settings(mesh_ca_settle=value)) == seconds


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("0s", "must be positive"),
        ("soon", "is not a duration"),
        # The bounds, as durations the setting accepts.
        ("500ms", "must be between 1s and 5m"),
        ("6m", "must be between 1s and 5m"),
    ],
)
def test_a_settle_setting_out_of_bounds_is_refused(value: str, why: str) -> None:
    with pytest.raises(ApiError, match=f"MESHPLANE_MESH_CA_SETTLE: .*{why}"):
        mesh_ca_settle(Settings(mesh_ca_settle=value))


def test_every_phase_has_a_row_for_every_event() -> None:
    assert set(cr.TABLE) == {(p, e) for p in Phase for e in Event}


def test_the_state_survives_its_json() -> None:
    for state in (IDLE, TRUSTING, SIGNING, DONE):
        assert cr.from_json(cr.to_json(state)) == state


def test_progress_counts_live_certificates_only() -> None:
    records = [
        SigningRecord("a", "new", not_after=T0 + 100, issued=T0 + 5),
        SigningRecord("b", "old", not_after=T0 + 100, issued=T0 - 5),
        SigningRecord("c", "old", not_after=T0 - 1, issued=T0 - 50),  # expired: ignored
    ]
    assert cr.progress_of(records, "new", T0, T0) == Progress(2, 1, 1, T0 + 5)
    assert cr.progress_of([], "new", T0, T0) == Progress()
