"""The all-or-nothing decision rule, the in-memory store, windows and keys."""

from __future__ import annotations

import pytest

from ratelimit.buckets import Bucket, bucket_key, domain_tag, window_at
from ratelimit.store import decide
from ratelimit.store.memory import MemoryStore

W = window_at(60, 1_800_000_010.0)


def bucket(key: str, limit: int, cost: int = 1, shadow: bool = False) -> Bucket:
    return Bucket(key, limit, cost, W, shadow)


@pytest.mark.parametrize(
    ("limits_costs_shadow", "before", "allowed", "after", "fits"),
    [
        ([(10, 1, False)], [0], True, (1,), (True,)),
        ([(10, 1, False)], [9], True, (10,), (True,)),
        ([(10, 1, False)], [10], False, (10,), (False,)),
        ([(10, 3, False)], [8], False, (8,), (False,)),  # cost exceeds what is left
        ([(10, 0, False)], [9], True, (9,), (True,)),  # cost 0: check only
        ([(10, 0, False)], [10], False, (10,), (False,)),  # cost 0 on an empty bucket: denied
        ([(0, 1, False)], [0], False, (0,), (False,)),  # a zero limit always denies
        # Two rules OR'ed: the second denies, the first is left untouched.
        ([(10, 1, False), (2, 1, False)], [3, 2], False, (3, 2), (True, False)),
        # A shadow rule never denies; a full shadow bucket is not charged.
        ([(10, 1, False), (2, 1, True)], [3, 2], True, (4, 2), (True, False)),
        ([(10, 1, False), (2, 1, True)], [3, 1], True, (4, 2), (True, True)),
        # A denial by a real rule charges the shadow bucket nothing either.
        ([(1, 1, False), (5, 1, True)], [1, 0], False, (1, 0), (False, True)),
    ],
)
def test_decide(
    limits_costs_shadow: list[tuple[int, int, bool]],
    before: list[int],
    allowed: bool,
    after: tuple[int, ...],
    fits: tuple[bool, ...],
) -> None:
    buckets = [bucket(f"k{i}", *lcs) for i, lcs in enumerate(limits_costs_shadow)]
    outcome = decide(buckets, before)
    assert (outcome.allowed, outcome.counts, outcome.fits) == (allowed, after, fits)


async def test_memory_store_counts_refills_and_forgets() -> None:
    store = MemoryStore()
    b = bucket("a", 2)
    now = 1_800_000_010.0
    assert (await store.apply([b], now)).allowed
    assert (await store.apply([b], now)).allowed
    assert not (await store.apply([b], now)).allowed
    assert not (await store.apply([b], now + 49.9)).allowed
    # The window turned: the same key is a new counter (keys carry the window start).
    nxt = Bucket("a2", 2, 1, window_at(60, now + 50), False)
    assert (await store.apply([nxt], now + 50)).allowed
    store.sweep(now + 50)
    assert len(store) == 1


def test_windows_are_epoch_aligned_and_reset_rounds_up() -> None:
    w = window_at(60, 1_800_000_010.5)
    assert (w.start, w.end) == (1_800_000_000, 1_800_000_060)
    assert w.reset_after(1_800_000_010.5) == 50
    assert w.reset_after(1_800_000_059.9) == 1
    assert window_at(1, 5.7).reset_after(5.7) == 1


def test_keys_share_the_domain_hash_tag_and_do_not_collide() -> None:
    a = bucket_key("rl:", "dom", [("a_b", "c")], W)
    b = bucket_key("rl:", "dom", [("a", "b_c")], W)
    assert a != b
    tag = "{" + domain_tag("dom") + "}"
    assert a.startswith("rl:" + tag) and b.startswith("rl:" + tag)
    assert f":60:{W.start}:" in a
    assert domain_tag("}{weird") != domain_tag("other")


@pytest.mark.parametrize(
    ("modes", "before", "allowed", "after"),
    [
        # q: quota, b: binding, s: shadow; limit 2, cost 1 each.
        ("qq", [2, 1], True, (2, 2)),  # one quota bucket fits: allowed, the full one untouched
        ("qq", [2, 2], False, (2, 2)),  # every quota bucket is full: denied
        ("qb", [2, 0], False, (2, 0)),  # ... even when a binding bucket fits
        ("qb", [0, 2], False, (0, 2)),  # a full binding bucket denies whatever quota says
        ("qs", [2, 2], False, (2, 2)),  # a shadow bucket is not a quota one
        ("q", [1], True, (2,)),
    ],
)
def test_decide_quota(modes: str, before: list[int], allowed: bool, after: tuple[int, ...]) -> None:
    """The reference's quota_mode: over only when every quota bucket is."""
    buckets = [Bucket(f"k{i}", 2, 1, W, m == "s", quota=m == "q") for i, m in enumerate(modes)]
    outcome = decide(buckets, before)
    assert (outcome.allowed, outcome.counts) == (allowed, after)
