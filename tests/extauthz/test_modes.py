"""The shared decision table over a real gRPC socket and over the HTTP mode."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from envoy.service.auth.v3 import external_auth_pb2

from extauthz.reasons import Reason

from .cases import CASES, GOOD, NOW, RAW_HEADER_CASES, Case
from .jwtkit import HS_SECRET, claims, make_token
from .policies import write_policies
from .support import GrpcClient, ServerThread, app_factory, check_request, http_check


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    os.environ["EXTAUTHZ_TEST_SECRET"] = HS_SECRET.decode()
    try:
        config = write_policies(tmp_path_factory.mktemp("policies"))
        with ServerThread(app_factory(config)) as srv:
            yield srv
    finally:
        os.environ.pop("EXTAUTHZ_TEST_SECRET", None)


@pytest.fixture(scope="module")
def grpc_client(server: ServerThread) -> Iterator[GrpcClient]:
    client = GrpcClient(server.port)
    yield client
    client.close()


def assert_grpc_decision(response: external_auth_pb2.CheckResponse, expect: Reason) -> None:
    if expect in (Reason.OK, Reason.ALLOW_POLICY):
        assert response.status.code == 0
        assert response.HasField("ok_response")
        return
    assert response.status.code == 7, response
    assert response.HasField("denied_response")
    assert response.denied_response.status.code == 403
    headers = {h.header.key: h.header.value for h in response.denied_response.headers}
    assert headers["x-ext-authz-reason"] == expect.value
    assert json.loads(response.denied_response.body) == {
        "error": "forbidden",
        "reason": expect.value,
    }


def grpc_headers(case: Case) -> dict[str, str]:
    # Envoy merges duplicates; a hand-built request may still carry two
    # spellings of the key, which the adapter lower-cases and counts.
    names = ["authorization", "Authorization"]
    return {names[i]: value for i, value in enumerate(case.auth)}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_grpc(grpc_client: GrpcClient, case: Case) -> None:
    response = grpc_client.check(check_request(case.path, grpc_headers(case), policy=case.policy))
    assert_grpc_decision(response, case.expect)


def http_target(case: Case) -> str:
    return "/check/" + (case.policy if case.policy is not None else "-") + case.path


@pytest.mark.parametrize("case", [c for c in CASES if c.http], ids=lambda c: c.name)
def test_http(server: ServerThread, case: Case) -> None:
    result = http_check(
        server.http_port, http_target(case), [("authorization", v) for v in case.auth]
    )
    if case.expect in (Reason.OK, Reason.ALLOW_POLICY):
        assert result.status == 200, result
        assert result.header("x-ext-authz-reason") is None
        return
    assert result.status == 403, result
    assert result.header("x-ext-authz-reason") == case.expect.value
    assert json.loads(result.body) == {"error": "forbidden", "reason": case.expect.value}


@pytest.mark.parametrize("case", RAW_HEADER_CASES, ids=lambda c: c.name)
def test_grpc_raw_header_map(grpc_client: GrpcClient, case: Case) -> None:
    raw = [(":path", case.path.encode()), (":method", b"GET")]
    raw += [("authorization", value.encode()) for value in case.auth]
    if case.name == "raw-not-utf8":
        raw.append(("authorization", b"Bearer " + GOOD.encode()[:-1] + b"\xff"))
    # With encode_raw_headers Envoy leaves attributes.request.http.path set too;
    # clear it here so the :path fallback is exercised as well.
    request = check_request("", raw_headers=raw)
    assert_grpc_decision(grpc_client.check(request), case.expect)


def test_path_header_fallback(grpc_client: GrpcClient) -> None:
    request = check_request("", {"authorization": f"Bearer {GOOD}"})
    request.attributes.request.http.headers[":path"] = "/headers/x"
    assert_grpc_decision(grpc_client.check(request), Reason.OK)
    request.attributes.request.http.headers[":path"] = "/get"
    assert_grpc_decision(grpc_client.check(request), Reason.PATH_NOT_ALLOWED)


def test_empty_request_is_an_explicit_deny(grpc_client: GrpcClient) -> None:
    response = grpc_client.check(external_auth_pb2.CheckRequest())
    assert_grpc_decision(response, Reason.MISSING_AUTHORIZATION)
    assert response.ByteSize() > 0


def test_allow_mutations_in_both_modes(server: ServerThread, grpc_client: GrpcClient) -> None:
    token = make_token(claims(NOW, sub="alice", tier=2, groups=["x"]))
    response = grpc_client.check(
        check_request("/headers", {"authorization": f"Bearer {token}"}, policy="hdr")
    )
    assert response.status.code == 0
    ok = response.ok_response
    assert [(h.header.key, h.header.value) for h in ok.headers] == [
        ("x-jwt-sub", "alice"),
        ("x-jwt-tier", "2"),
    ]
    assert all(h.append_action == h.OVERWRITE_IF_EXISTS_OR_ADD for h in ok.headers)
    assert list(ok.headers_to_remove) == ["authorization", "x-jwt-groups"]

    result = http_check(
        server.http_port, "/check/hdr/headers", [("authorization", f"Bearer {token}")]
    )
    assert result.status == 200
    assert result.header("x-jwt-sub") == "alice"
    assert result.header("x-jwt-tier") == "2"
    assert result.header("x-envoy-auth-headers-to-remove") == "authorization,x-jwt-groups"


def test_http_requests_outside_the_check_prefix_are_denied(server: ServerThread) -> None:
    for target in ("/headers", "/check", "/check/", "/checkhs/headers", "/check//headers"):
        result = http_check(server.http_port, target, [("authorization", f"Bearer {GOOD}")])
        assert result.status == 403, target
    assert (
        http_check(server.http_port, "/check/hs", [("authorization", f"Bearer {GOOD}")]).header(
            "x-ext-authz-reason"
        )
        == Reason.MISSING_PATH.value
    )
