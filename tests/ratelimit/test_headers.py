"""Header rendering: the exact strings, matching Envoy's DRAFT_VERSION_03 vectors."""

from __future__ import annotations

from ratelimit.headers import HeaderNames, LimitView, render

NAMES = HeaderNames()


def test_envoy_vector_with_names() -> None:
    views = [LimitView(1, 60, 2, 3, "first"), LimitView(4, 3600, 5, 6, "second")]
    assert render(views, over_limit=False, names=NAMES) == [
        ("x-ratelimit-limit", '1, 1;w=60;name="first", 4;w=3600;name="second"'),
        ("x-ratelimit-remaining", "2"),
        ("x-ratelimit-reset", "3"),
    ]


def test_closest_is_least_remaining_first_on_tie_and_all_listed_in_order() -> None:
    views = [LimitView(100, 3600, 7, 50), LimitView(10, 60, 3, 20), LimitView(5, 1, 3, 1)]
    assert render(views, over_limit=True, names=NAMES) == [
        ("x-ratelimit-limit", "10, 100;w=3600, 10;w=60, 5;w=1"),
        ("x-ratelimit-remaining", "3"),
        ("x-ratelimit-reset", "20"),
        ("x-proxy-ratelimited", "true"),
    ]


def test_no_limited_descriptor_means_no_headers() -> None:
    assert render([], over_limit=False, names=NAMES) == []
    assert render([], over_limit=True, names=NAMES) == [("x-proxy-ratelimited", "true")]


def test_names_are_configurable() -> None:
    names = HeaderNames(
        limit="ratelimit-limit",
        remaining="ratelimit-remaining",
        reset="ratelimit-reset",
        ratelimited="x-limited",
    )
    assert render([LimitView(3, 3600, 0, 10)], over_limit=True, names=names) == [
        ("ratelimit-limit", "3, 3;w=3600"),
        ("ratelimit-remaining", "0"),
        ("ratelimit-reset", "10"),
        ("x-limited", "true"),
    ]
