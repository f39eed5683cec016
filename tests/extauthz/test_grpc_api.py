"""Reading a CheckRequest: every spelling of ``authorization`` is found,
whether or not the request's bytes are at hand (the handler passes them, to
skip a scan of every header key when no capitalised spelling can exist)."""

from __future__ import annotations

import pytest
from envoy.service.auth.v3 import external_auth_pb2

from extauthz.grpc_api import attributes_from_check, encode_response, response_for
from extauthz.reasons import Decision, Reason


def _request(headers: dict[str, str]) -> external_auth_pb2.CheckRequest:
    request = external_auth_pb2.CheckRequest()
    http = request.attributes.request.http
    http.path = "/headers"
    http.headers.update(headers)
    return request


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"authorization": "Bearer a", "x-a": "1"}, ("Bearer a",)),
        ({"x-a": "1"}, ()),
        ({"Authorization": "Bearer a"}, ("Bearer a",)),
        ({"authorization": "Bearer a", "AUTHORIZATION": "Bearer b"}, ("Bearer a", "Bearer b")),
        # A capital in a value (not a key) only takes the slower test.
        ({"authorization": "Bearer a", "x-note": "Authorization"}, ("Bearer a",)),
        ({"X-Other": "1", "authorization": "Bearer a"}, ("Bearer a",)),
        # The word in a value, lower-case, with and without the key itself.
        ({"authorization": "Bearer a", "x-note": "authorization"}, ("Bearer a",)),
        ({"x-note": "authorization"}, ()),
        ({"x-note": "authorization", "Authorization": "Bearer a"}, ("Bearer a",)),
    ],
)
def test_every_spelling_of_authorization(
    headers: dict[str, str], expected: tuple[str, ...]
) -> None:
    request = _request(headers)
    raw = request.SerializeToString()
    with_bytes = attributes_from_check(external_auth_pb2.CheckRequest.FromString(raw), raw)
    without = attributes_from_check(request)
    assert sorted(with_bytes.authorization) == sorted(expected)
    # Map order is not part of the contract: two spellings are a deny either way.
    assert sorted(without.authorization) == sorted(expected)
    assert (with_bytes.path, with_bytes.policy) == (without.path, without.policy)


def test_encoded_allows_are_the_response_bytes_on_every_call() -> None:
    # The identity memo answers a repeated decision with its first encoding;
    # an equal decision built anew gets the same bytes.
    claims = Decision(
        True, Reason.OK, "p", (("x-sub", "alice"),), ("authorization",), (("sub", "alice"),)
    )
    plain = Decision(True, Reason.OK, "p")
    for decision in (claims, plain, claims, plain):
        assert encode_response(decision) == response_for(decision).SerializeToString()
    again = Decision(
        True, Reason.OK, "p", (("x-sub", "alice"),), ("authorization",), (("sub", "alice"),)
    )
    assert encode_response(again) == encode_response(claims)


def test_an_allow_that_cannot_be_encoded_is_denied() -> None:
    # A lone surrogate is no UTF-8: protobuf refuses the header value.
    broken = Decision(True, Reason.OK, "p", (("x-sub", "\ud800"),))
    for _ in range(2):
        response = external_auth_pb2.CheckResponse.FromString(encode_response(broken))
        assert response.status.code == 7
        assert response.denied_response.status.code == 403
