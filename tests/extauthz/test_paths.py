"""Pure table tests of request-path normalization and path-claim decoding."""

from __future__ import annotations

import pytest

from extauthz.paths import (
    MEMO_MAX_CHARS,
    PathMatch,
    PathMemo,
    decode_path_claim,
    normalize_request_path,
    path_allowed,
    remove_dot_segments,
)
from extauthz.reasons import Denied, Reason

from .jwtkit import b64path


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("/headers", "/headers"),
        ("/headers?x=1", "/headers"),
        ("/headers#frag", "/headers"),
        ("/headers?a=/../admin", "/headers"),
        ("/a/b/../c", "/a/c"),
        ("/a/./b/.", "/a/b/"),
        ("/a/..", "/"),
        ("/../../etc", "/etc"),
        ("/%68eaders", "/headers"),
        ("/headers/%2e%2e/admin", "/admin"),
        ("/headers/%2E%2E/admin", "/admin"),
        ("//headers", "/headers"),
        ("/a//b///c", "/a/b/c"),
        ("/caf%C3%A9", "/café"),
        ("/a..b/c.d", "/a..b/c.d"),
        ("/Headers", "/Headers"),
        ("/headers;v=1/x", "/headers;v=1/x"),
        ("/a;b/../c", "/c"),
    ],
)
def test_normalizes(raw: str, expected: str) -> None:
    assert normalize_request_path(raw) == expected


@pytest.mark.parametrize(
    "raw",
    [
        "headers",  # not absolute
        "*",
        "http://host/headers",  # absolute-form never reaches us from Envoy
        "?x",
        "/a%2Fb",
        "/a%2fb",
        "/a%5Cb",
        "/a%5cb",
        "/a\\b",
        "/a\x00b",
        "/a\nb",
        "/a\x7fb",
        "/a\x85b",
        "/a%0Ab",
        "/a%00b",
        "/a%7F",
        "/a%252e%252e/b",  # double encoding
        "/a%25",
        "/a%zz",
        "/a%4",
        "/a%",
        "/a%FFb",  # not UTF-8 once decoded
        "/headers//../admin",  # ambiguous: merge-then-resolve differs from resolve-then-merge
        "/headers/..;/admin",  # Tomcat-style path parameter on a dot-segment
        "/headers/.;x/y",
        "/headers/%2e%2e;/admin",
    ],
)
def test_denies_bad_paths(raw: str) -> None:
    with pytest.raises(Denied) as info:
        normalize_request_path(raw)
    assert info.value.reason is Reason.BAD_PATH


def test_empty_path_is_missing() -> None:
    with pytest.raises(Denied) as info:
        normalize_request_path("")
    assert info.value.reason is Reason.MISSING_PATH


@pytest.mark.parametrize(
    ("path", "expected"),
    [("/a/b/c/./../../g", "/a/g"), ("/mid/content=5/../6", "/mid/6"), ("/", "/")],
)
def test_remove_dot_segments_rfc3986_examples(path: str, expected: str) -> None:
    assert remove_dot_segments(path) == expected


@pytest.mark.parametrize(
    ("claim", "expected"),
    [
        ("L2hlYWRlcnM=", "/headers"),  # the TSB demo claim
        ("L2hlYWRlcnM", "/headers"),  # unpadded
        (b64path("/a~b"), "/a~b"),  # std alphabet with '+'
        (b64path("/a~b", urlsafe=True), "/a~b"),  # url alphabet with '-'
        (b64path("/a~b", urlsafe=True, pad=False), "/a~b"),
        (b64path("/"), "/"),
        (b64path("/headers/"), "/headers/"),
        (b64path("/café"), "/café"),
    ],
)
def test_decodes_path_claims(claim: str, expected: str) -> None:
    assert decode_path_claim(claim) == expected


@pytest.mark.parametrize(
    "claim",
    [
        None,
        123,
        True,
        ["L2hlYWRlcnM="],
        "",
        "====",
        "L2hlYWRlcnM==",  # wrong padding
        "L2hlYWRlcnM=x",
        "L2hl YWRlcnM=",
        "L2hlYWRlcnN=",  # non-canonical trailing bits
        "L2F+Yg_",  # mixed alphabets
        b64path("headers"),  # not absolute
        b64path("/a/../b"),
        b64path("/a/./b"),
        b64path("/.."),
        b64path("/a%2Fb"),
        b64path("/a\\b"),
        b64path("/a\nb"),
        "L2Fi" + "/w==",  # decodes to invalid UTF-8
        "A" * 5000,
    ],
)
def test_rejects_bad_claims(claim: object) -> None:
    with pytest.raises(Denied) as info:
        decode_path_claim(claim)
    assert info.value.reason is Reason.BAD_PATH_CLAIM


@pytest.mark.parametrize(
    ("path", "prefix", "prefix_ok", "segment_ok"),
    [
        ("/headers", "/headers", True, True),
        ("/headers/x", "/headers", True, True),
        ("/headers-admin", "/headers", True, False),
        ("/headersXYZ", "/headers", True, False),
        ("/headers/x", "/headers/", True, True),
        ("/headers", "/headers/", False, False),
        ("/Headers", "/headers", False, False),
        ("/get", "/headers", False, False),
        ("/anything", "/", True, True),
    ],
)
def test_prefix_and_segment_matching(
    path: str, prefix: str, prefix_ok: bool, segment_ok: bool
) -> None:
    assert path_allowed(path, prefix, PathMatch.PREFIX) is prefix_ok
    assert path_allowed(path, prefix, PathMatch.SEGMENT) is segment_ok


def test_path_memo_answers_as_normalization_and_stays_bounded() -> None:
    memo = PathMemo(max_entries=2)
    assert memo.normalize("/a/b/../c?x=1") == "/a/c"
    assert memo.known == {"/a/b/../c?x=1": "/a/c"}
    # A refused target raises every time and is never kept.
    for _ in range(2):
        with pytest.raises(Denied) as info:
            memo.normalize("/a%2Fb")
        assert info.value.reason is Reason.BAD_PATH
    assert "/a%2Fb" not in memo.known
    memo.normalize("/b")
    memo.normalize("/c")  # the oldest entry makes room
    assert list(memo.known) == ["/b", "/c"]
    long = "/" + "x" * MEMO_MAX_CHARS
    assert memo.normalize(long) == long
    assert long not in memo.known
