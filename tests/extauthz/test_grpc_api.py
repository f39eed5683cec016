"""Reading a CheckRequest: every spelling of ``authorization`` is found,
whether or not the request's bytes are at hand (the handler passes them, to
skip a scan of every header key when no capitalised spelling can exist)."""

from __future__ import annotations

import pytest
from envoy.service.auth.v3 import external_auth_pb2

from extauthz.grpc_api import attributes_from_check


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
