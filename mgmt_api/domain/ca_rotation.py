"""The mesh CA's rotation with an overlap: a pure state machine ((phase, event) → phase).

A sidecar accepts a peer's certificate only if its ``mesh-ca`` bundle holds
the CA that signed it, so a new CA may sign only once every sidecar trusts
it, and the old one may leave the bundle only once no sidecar presents a
certificate of it. Hence four phases (docs/mesh.md, "CA rotation"):

- ``idle``: one CA; it signs and is the whole bundle;
- ``trusting``: a new CA exists and is in every bundle; the old one still
  signs. It ends when every sidecar holding a certificate of the cluster was
  issued one since the phase began (and with it the two-CA bundle), plus
  :data:`SETTLE` (or the configured settle time) for the push to be applied, or at the latest after
  :data:`TRUST_WAIT` (a sidecar away then gets the new bundle when it
  reconnects);
- ``signing``: the new CA signs (sidecars re-issue at once: their bundle
  changed); the old one stays in the bundle. It ends when no certificate of
  the cluster that has not expired was signed by another CA than the new one,
  plus :data:`SETTLE` after the last of them was issued;
- ``done``: the old CA has left the bundle; the new one is the cluster's CA.
  A new rotation may start, as from ``idle``.

Everything here is pure: the clock (``now``) and what the signing records
say (:class:`Progress`) are arguments, so the whole table is tested row by
row (``tests/mesh/test_mesh_ca_machine.py``). The store
(:class:`mgmt_api.service.mesh_ca.MeshCaStore`) persists the
:class:`Rotation`, feeds the events and applies what a transition means.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import StrEnum

#: After the last certificate a phase waits for was issued: time for Envoy to
#: apply the pushed secrets (milliseconds in practice) and for the stream's
#: ACK; a margin, not a measurement. The default of ``MESHPLANE_MESH_CA_SETTLE``
#: (:data:`MIN_SETTLE`..:data:`MAX_SETTLE`), passed to :func:`step`.
SETTLE = 10.0
MIN_SETTLE = 1.0
MAX_SETTLE = 300.0
#: Longest ``trusting`` phase: a connected sidecar gets the two-CA bundle on its
#: stream's next wake-up (at most 5 s after the phase's write), so this bounds a
#: wait for sidecars that hold a certificate but are not connected.
TRUST_WAIT = 120.0


class Phase(StrEnum):
    IDLE = "idle"
    TRUSTING = "trusting"
    SIGNING = "signing"
    DONE = "done"


class Event(StrEnum):
    START = "start"  # an operator asked for a rotation
    TICK = "tick"  # time passed, or the signing records changed


#: The phases in which two CAs are in the bundle.
RUNNING = frozenset({Phase.TRUSTING, Phase.SIGNING})


class RotationRunning(RuntimeError):
    """A rotation was asked while one runs (REST: 409)."""


@dataclass(frozen=True)
class Progress:
    """What the signing records say at ``now``, counting unexpired certificates only.

    ``sidecars``: instances that hold one; ``issued_in_phase``: of them, issued
    since the current phase began; ``not_new``: of them, signed by another CA
    than the new one; ``last_issued``: when the latest was issued (0: none).
    """

    sidecars: int = 0
    issued_in_phase: int = 0
    not_new: int = 0
    last_issued: float = 0.0


@dataclass(frozen=True)
class SigningRecord:
    """An instance's current certificate: who signed it (serial, hex), until and since when."""

    instance: str
    issuer: str
    not_after: float
    issued: float


def progress_of(
    records: Iterable[SigningRecord], new_issuer: str, phase_since: float, now: float
) -> Progress:
    """The :class:`Progress` the records give at ``now`` (expired certificates left out)."""
    live = [r for r in records if r.not_after > now]
    return Progress(
        sidecars=len(live),
        issued_in_phase=sum(1 for r in live if r.issued > phase_since),
        not_new=sum(1 for r in live if r.issuer != new_issuer),
        last_issued=max((r.issued for r in live), default=0.0),
    )


@dataclass(frozen=True)
class Rotation:
    """The persisted state: the phase, since when, and when the rotation was asked."""

    phase: Phase = Phase.IDLE
    since: float = 0.0
    started: float = 0.0


def _start(state: Rotation, now: float, _: Progress, settle: float) -> Rotation:
    return Rotation(Phase.TRUSTING, since=now, started=now)


def _refuse(state: Rotation, now: float, _: Progress, settle: float) -> Rotation:
    raise RotationRunning(f"a rotation of the mesh CA is {state.phase.value} since {state.since}")


def _stay(state: Rotation, now: float, _: Progress, settle: float) -> Rotation:
    return state


def _settled(state: Rotation, now: float, progress: Progress, settle: float) -> bool:
    return now >= max(state.since, progress.last_issued) + settle


def _trusting(state: Rotation, now: float, progress: Progress, settle: float) -> Rotation:
    everyone = progress.issued_in_phase >= progress.sidecars
    if (everyone and _settled(state, now, progress, settle)) or now >= state.since + TRUST_WAIT:
        return replace(state, phase=Phase.SIGNING, since=now)
    return state


def _signing(state: Rotation, now: float, progress: Progress, settle: float) -> Rotation:
    if progress.not_new == 0 and _settled(state, now, progress, settle):
        return replace(state, phase=Phase.DONE, since=now)
    return state


#: (state, now, progress, settle) → the next state.
Transition = Callable[[Rotation, float, Progress, float], Rotation]

#: The whole machine. Every (phase, event) pair has a row.
TABLE: dict[tuple[Phase, Event], Transition] = {
    (Phase.IDLE, Event.START): _start,
    (Phase.IDLE, Event.TICK): _stay,
    (Phase.TRUSTING, Event.START): _refuse,
    (Phase.TRUSTING, Event.TICK): _trusting,
    (Phase.SIGNING, Event.START): _refuse,
    (Phase.SIGNING, Event.TICK): _signing,
    (Phase.DONE, Event.START): _start,
    (Phase.DONE, Event.TICK): _stay,
}


def step(
    state: Rotation,
    event: Event,
    now: float,
    progress: Progress = Progress(),
    settle: float = SETTLE,
) -> Rotation:
    """The state after ``event`` at ``now``, a phase waiting ``settle`` seconds after the
    last certificate it waits for; raises :class:`RotationRunning` for a second start."""
    return TABLE[(state.phase, event)](state, now, progress, settle)


def to_json(state: Rotation) -> dict[str, object]:
    return {"phase": state.phase.value, "since": state.since, "started": state.started}


def from_json(doc: dict[str, object]) -> Rotation:
    since, started = doc.get("since", 0.0), doc.get("started", 0.0)
    return Rotation(
        Phase(str(doc.get("phase", Phase.IDLE.value))),
        float(since) if isinstance(since, int | float) else 0.0,
        float(started) if isinstance(started, int | float) else 0.0,
    )
