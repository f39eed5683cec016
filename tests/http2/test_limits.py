"""Limits refuse, at construction, values the connection could not honour."""

from __future__ import annotations

from typing import Any

import pytest

from meshplane.servers.h2.http2.limits import DEFAULT_LIMITS, Limits, ResetBudget


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_concurrent_streams", 0),
        ("max_frame_size", 16_383),  # RFC 9113 6.5.2's range
        ("max_frame_size", 1 << 24),
        ("max_header_list_bytes", 0),
        ("max_header_block_bytes", 0),
        ("max_body_bytes", -1),
        ("max_connection_body_bytes", -1),
        ("stream_window", 65_534),  # below the RFC default a fast peer would overrun it
        ("stream_window", 1 << 31),
        ("connection_window", 65_534),  # the connection window can only grow
        ("connection_window", 1 << 31),
        ("header_cache_bytes", -1),
        ("max_outbound_control_frames", 0),
        ("max_empty_frames", -1),
        ("max_priority_frames_per_stream", -1),
        ("max_window_updates_per_data_frame", -1),
        ("max_settings_entries", 5),  # a peer may send each of the RFC's six
    ],
)
def test_bad_values_are_refused(field: str, value: int) -> None:
    kwargs: dict[str, Any] = {field: value}
    with pytest.raises(ValueError, match=field):
        Limits(**kwargs)


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 10), (-1.0, 10), (10.0, 0)])
def test_bad_reset_budgets_are_refused(rate: float, burst: int) -> None:
    with pytest.raises(ValueError, match="reset budget"):
        ResetBudget(per_second=rate, burst=burst)


def test_the_defaults_are_the_documented_ones() -> None:
    assert Limits() == DEFAULT_LIMITS
    assert DEFAULT_LIMITS.max_body_bytes == 4 * 1024 * 1024 + 5
    assert DEFAULT_LIMITS.reset_budget == ResetBudget(per_second=200.0, burst=256)
    Limits(max_empty_frames=0, header_cache_bytes=0, max_body_bytes=0)  # all allowed
