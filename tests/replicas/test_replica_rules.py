"""The pure rules of the hop between replicas and of job periods (mgmt_api.domain.replicas)."""

from __future__ import annotations

import hashlib

import pytest

from mgmt_api.domain import replicas as rules

SECRET = b"shared-secret"
BODY = b'{"organization":"o"}'
NOW = 1_800_000_000.0
ME = "5f0c2a9e7d3b4c1a8e6f0d2b4a6c8e0f"
OTHER = "0123456789abcdef0123456789abcdef"
NONCE = "a" * 32
HOP = rules.Hop("POST", "/internal/v1/tunnelcalls", BODY)


def signed(hop: rules.Hop = HOP, target: str = ME, now: float = NOW, nonce: str = NONCE) -> str:
    return rules.sign(SECRET, hop, target=target, now=now, nonce=nonce)


def test_a_signature_verifies_with_the_same_secret_request_target_and_a_fresh_clock() -> None:
    verified = rules.verify(SECRET, signed(), HOP, ME, NOW + 5)
    assert verified == rules.Signature(int(NOW), NONCE, ME, signed().rpartition("=")[2])


@pytest.mark.parametrize(
    ("secret", "hop", "me", "now", "why"),
    [
        (b"other-secret", HOP, ME, NOW, rules.Refusal.BAD_MAC),
        (SECRET, rules.Hop("POST", HOP.path, BODY + b" "), ME, NOW, rules.Refusal.BAD_MAC),
        (SECRET, rules.Hop("PUT", HOP.path, BODY), ME, NOW, rules.Refusal.BAD_MAC),
        (SECRET, rules.Hop("POST", "/internal/v1/other", BODY), ME, NOW, rules.Refusal.BAD_MAC),
        (SECRET, HOP, OTHER, NOW, rules.Refusal.WRONG_TARGET),
        (SECRET, HOP, ME, NOW + rules.MAX_SKEW_SECONDS + 1, rules.Refusal.STALE),
        (SECRET, HOP, ME, NOW - rules.MAX_SKEW_SECONDS - 1, rules.Refusal.STALE),
    ],
    ids=["secret", "body", "method", "path", "target", "too-old", "from-the-future"],
)
def test_a_signature_is_refused(
    secret: bytes, hop: rules.Hop, me: str, now: float, why: rules.Refusal
) -> None:
    assert rules.verify(secret, signed(), hop, me, now) is why


def test_a_signature_edited_to_name_another_target_or_nonce_no_longer_verifies() -> None:
    header = signed(target=OTHER)
    retargeted = header.replace(f"r={OTHER}", f"r={ME}")
    assert rules.verify(SECRET, retargeted, HOP, ME, NOW) is rules.Refusal.BAD_MAC
    renonced = signed().replace(f"n={NONCE}", f"n={'b' * 32}")
    assert rules.verify(SECRET, renonced, HOP, ME, NOW) is rules.Refusal.BAD_MAC


GOOD = signed()
MAC = GOOD.rpartition("=")[2]


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "garbage",
        "x" * 500,
        "t=abc,v1=00",
        "v1=00",
        "t=1800000000",
        "t=1,v1=00",  # the old shape: no nonce, no target
        "t=\xb2,v1=00",  # "²": str.isdigit() says yes, int() raises
        f"t=\xb2,n={NONCE},r={ME},v1={MAC}",
        f"t=\u0661\u0662,n={NONCE},r={ME},v1={MAC}",  # Arabic-Indic digits
        f"t=1800000000,n={NONCE},r={ME}",  # no MAC
        f"t=1800000000,r={ME},v1={MAC}",  # no nonce
        f"t=1800000000,n={NONCE},v1={MAC}",  # no target
        f"n={NONCE},r={ME},v1={MAC}",  # no time
        f"t=1800000000,n={NONCE[:-1]},r={ME},v1={MAC}",  # short nonce
        f"t=1800000000,n={NONCE.upper()},r={ME},v1={MAC}",
        f"t=1800000000,n={NONCE},r={ME},v1={MAC}0",  # long MAC
        f"t=1800000000,n={NONCE},r={ME},v1={MAC},x=1",  # a part too many
        f"t=1800000000,t=1800000000,n={NONCE},r={ME},v1={MAC}",
        f"t=1800000000,n={NONCE},r={ME},v1={MAC}\n",
        f" {GOOD}",
        f"t=1800000000,n={NONCE},r={'r' * 65},v1={MAC}",  # target too long
        f"t=1800000000,n={NONCE},r=a b,v1={MAC}",
        f"t=1800000000000000,n={NONCE},r={ME},v1={MAC}",  # 16 digits
        GOOD + " " * 300,  # oversized
    ],
)
def test_a_malformed_signature_is_refused_as_malformed_never_an_exception(
    header: str | None,
) -> None:
    assert rules.parse(header) is None
    assert rules.verify(SECRET, header, HOP, ME, NOW) is rules.Refusal.MALFORMED


def test_the_signed_text_names_every_field_and_the_bodys_digest_only() -> None:
    text = rules.signed_text(HOP, 7, NONCE, ME).decode()
    digest = hashlib.sha256(BODY).hexdigest()
    assert text.split("\n") == ["v1", "POST", HOP.path, ME, "7", NONCE, digest]


def test_a_nonce_is_admitted_once_until_its_signature_expires() -> None:
    cache = rules.NonceCache(capacity=4)
    first = rules.parse(signed())
    assert first is not None
    assert cache.admit(first, NOW) is None
    assert cache.admit(first, NOW + 1) is rules.Refusal.REPLAYED
    assert cache.admit(first, NOW + rules.MAX_SKEW_SECONDS) is rules.Refusal.REPLAYED
    # Past the window the signature is refused as stale; its nonce is forgotten.
    assert cache.admit(first, NOW + rules.MAX_SKEW_SECONDS + 1) is None
    assert len(cache) == 1


def test_the_nonce_cache_is_bounded_and_refuses_rather_than_forgetting_a_live_nonce() -> None:
    cache = rules.NonceCache(capacity=3)
    nonces = [f"{i:032x}" for i in range(4)]
    for nonce in nonces[:3]:
        assert cache.admit(rules.Signature(int(NOW), nonce, ME, MAC), NOW) is None
    late = rules.Signature(int(NOW), nonces[3], ME, MAC)
    assert cache.admit(late, NOW) is rules.Refusal.CACHE_FULL
    assert len(cache) == 3
    # Once the first three expire, there is room again.
    assert cache.admit(late, NOW + rules.MAX_SKEW_SECONDS + 1) is None
    assert len(cache) == 1


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


@pytest.mark.parametrize(
    ("address", "plain"),
    [
        ("https://10.0.0.7:8443", False),
        ("HTTPS://mgmt-api-0.example:8443", False),
        ("http://127.0.0.1:8443", False),
        ("http://[::1]:8443", False),
        ("http://localhost:8443", False),
        ("http://10.0.0.7:8443", True),
        ("http://mgmt-api-0:8443", True),
        ("10.0.0.7:8443", True),
        ("", True),
    ],
)
def test_the_hop_is_https_off_this_machine(address: str, plain: bool) -> None:
    assert rules.plain_hop(address) is plain
