"""The pure rules of the hop between replicas and of job periods (mgmt_api.domain.replicas)."""

from __future__ import annotations

import pytest

from mgmt_api.domain import replicas as rules

SECRET = b"shared-secret"
BODY = b'{"organization":"o"}'
NOW = 1_800_000_000.0


def test_a_signature_verifies_with_the_same_secret_body_and_a_fresh_clock() -> None:
    assert rules.verify(SECRET, rules.sign(SECRET, NOW, BODY), BODY, NOW + 5)


@pytest.mark.parametrize(
    ("secret", "body", "now", "why"),
    [
        (b"other-secret", BODY, NOW, "another secret"),
        (SECRET, BODY + b" ", NOW, "another body"),
        (SECRET, BODY, NOW + rules.MAX_SKEW_SECONDS + 1, "too old (a replay)"),
        (SECRET, BODY, NOW - rules.MAX_SKEW_SECONDS - 1, "from the future"),
    ],
)
def test_a_signature_is_refused(secret: bytes, body: bytes, now: float, why: str) -> None:
    assert not rules.verify(secret, rules.sign(SECRET, NOW, BODY), body, now), why


@pytest.mark.parametrize(
    "header", [None, "", "t=abc,v1=00", "v1=00", "t=1800000000", "x" * 500, "garbage"]
)
def test_a_malformed_signature_is_refused(header: str | None) -> None:
    assert not rules.verify(SECRET, header, BODY, NOW)


@pytest.mark.parametrize(
    ("now", "interval", "period", "next_start"),
    [
        (0.0, 60.0, 0, 60.0),
        (59.9, 60.0, 0, 60.0),
        (60.0, 60.0, 1, 120.0),
        (3601.0, 3600.0, 1, 7200.0),
    ],
)
def test_periods(now: float, interval: float, period: int, next_start: float) -> None:
    assert rules.period_of(now, interval) == period
    assert rules.next_period_start(now, interval) == next_start


def test_frames_split_wherever_the_bytes_are_cut() -> None:
    stream = rules.frame(b"one") + rules.frame(b"") + rules.frame(b"three")
    for cut in range(len(stream) + 1):
        reader = rules.FrameReader()
        assert reader.feed(stream[:cut]) + reader.feed(stream[cut:]) == [b"one", b"", b"three"]


def test_a_frame_over_the_cap_is_refused_before_it_is_buffered() -> None:
    header = (rules.MAX_FRAME_BYTES + 1).to_bytes(4, "big")
    with pytest.raises(ValueError, match="over the cap"):
        rules.FrameReader().feed(header)
