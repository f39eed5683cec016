"""The sampling gate (meshplane.tracing.Gate): pure, table-tested.

It decides before the SDK is asked for anything, so its table is the whole
of OTEL_TRACES_SAMPLER's semantics in meshplane. ``draw`` is fixed per row
(the gate's RNG is an argument), so no row depends on chance.
"""

from __future__ import annotations

import pytest

from meshplane.tracing import Gate, TraceSettings, start_tracing

SAMPLED = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
UNSAMPLED = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
LOW_ID = "00-4bf92f3577b34da60000000000000001-00f067aa0ba902b7-00"  # low 64 bits: 1
HIGH_ID = "00-4bf92f3577b34da6ffffffffffffffff-00f067aa0ba902b7-01"
#: Not a valid parent (all-zero trace id; version ff; too short): as if absent.
INVALID = (
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-01",
)


@pytest.mark.parametrize(
    ("parent", "ratio", "draw", "sampled"),
    [
        # the brief's table: parent sampled / unsampled / absent x ratio 0 / 0.01 / 1
        (SAMPLED, 0.0, 0.0, True),
        (SAMPLED, 0.01, 0.99, True),
        (SAMPLED, 1.0, 0.99, True),
        (UNSAMPLED, 0.0, 0.0, False),
        (UNSAMPLED, 0.01, 0.0, False),
        (UNSAMPLED, 1.0, 0.0, False),
        (None, 0.0, 0.0, False),
        (None, 0.01, 0.005, True),
        (None, 0.01, 0.01, False),
        (None, 0.01, 0.5, False),
        (None, 1.0, 0.999999, True),
        *((bad, 0.01, 0.005, True) for bad in INVALID),
        *((bad, 0.01, 0.5, False) for bad in INVALID),
    ],
)
def test_parentbased_traceidratio(
    parent: str | None, ratio: float, draw: float, sampled: bool
) -> None:
    assert Gate("parentbased_traceidratio", ratio, lambda: draw)(parent) is sampled


def _never() -> float:
    raise AssertionError("this row must not draw")


@pytest.mark.parametrize(
    ("sampler", "ratio", "parent", "sampled"),
    [
        ("always_on", 1.0, UNSAMPLED, True),  # not parent-based: the flag is ignored
        ("always_on", 1.0, None, True),
        ("always_off", 1.0, SAMPLED, False),
        ("parentbased_always_on", 1.0, None, True),
        ("parentbased_always_on", 1.0, UNSAMPLED, False),
        ("parentbased_always_off", 1.0, SAMPLED, True),
        ("parentbased_always_off", 1.0, None, False),
        # traceidratio with a parent: its trace id decides, as the SDK's
        # TraceIdRatioBased (low 64 bits below ratio * 2**64), never a draw
        ("traceidratio", 0.01, LOW_ID, True),
        ("traceidratio", 0.01, HIGH_ID, False),
        ("traceidratio", 1.0, HIGH_ID, True),
        ("traceidratio", 0.0, LOW_ID, False),
    ],
)
def test_other_samplers(sampler: str, ratio: float, parent: str | None, sampled: bool) -> None:
    assert Gate(sampler, ratio, _never)(parent) is sampled


def test_the_draw_is_the_ratio() -> None:
    """The default RNG: about 1 % of 100,000 parentless calls at 0.01."""
    gate = Gate("parentbased_traceidratio", 0.01)
    hits = sum(gate(None) for _ in range(100_000))
    assert 700 < hits < 1300


def test_started_tracing_carries_the_settings_gate() -> None:
    tracing = start_tracing(
        TraceSettings("http://127.0.0.1:1", sampler="parentbased_always_off", ratio=1.0)
    )
    assert tracing is not None
    try:
        assert tracing.gate(SAMPLED) and not tracing.gate(None)
    finally:
        tracing.shutdown()
