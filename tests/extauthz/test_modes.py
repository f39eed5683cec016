"""The shared decision table over a real gRPC socket and over the HTTP mode,
on every server (the Envoy-based one, h2): same decisions, statuses,
headers and bodies; and a Check the wire breaks is never an allow."""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from envoy.service.auth.v3 import external_auth_pb2

from extauthz.reasons import Reason
from tests.support.backends import BACKENDS
from tests.support.h2client import H2Client, frame
from tests.support.net import free_port, wait_for_port
from tests.support.processes import Service

from .cases import CASES, GOOD, NOW, RAW_HEADER_CASES, Case
from .jwtkit import HS_SECRET, claims, make_token
from .policies import write_policies
from .support import GrpcClient, check_request, http_check


@dataclass(frozen=True)
class Ports:
    port: int
    http_port: int


@pytest.fixture(scope="module", params=BACKENDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Ports]:
    """The same app on each server, as ``extauthz serve`` runs it."""
    os.environ["EXTAUTHZ_TEST_SECRET"] = HS_SECRET.decode()
    try:
        config = write_policies(tmp_path_factory.mktemp("policies"))
        port, http_port = free_port(), free_port()
        log = tmp_path_factory.mktemp("envoy-extauthz") / "stderr.log"
        service = Service(
            ["extauthz.cli", "serve", "--config", str(config), "--server", request.param,
             "--listen", f"127.0.0.1:{port}", "--http-listen", f"127.0.0.1:{http_port}"],
            port,
            log,
        ).start()  # fmt: skip
        try:
            wait_for_port(http_port, timeout=60)
            yield Ports(port, http_port)
        finally:
            assert service.stop() == 0
    finally:
        os.environ.pop("EXTAUTHZ_TEST_SECRET", None)


@pytest.fixture(scope="module")
def grpc_client(server: Ports) -> Iterator[GrpcClient]:
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
def test_http(server: Ports, case: Case) -> None:
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


def test_allow_mutations_in_both_modes(server: Ports, grpc_client: GrpcClient) -> None:
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


def test_http_requests_outside_the_check_prefix_are_denied(server: Ports) -> None:
    for target in ("/headers", "/check", "/check/", "/checkhs/headers", "/check//headers"):
        result = http_check(server.http_port, target, [("authorization", f"Bearer {GOOD}")])
        assert result.status == 403, target
    assert (
        http_check(server.http_port, "/check/hs", [("authorization", f"Bearer {GOOD}")]).header(
            "x-ext-authz-reason"
        )
        == Reason.MISSING_PATH.value
    )


CHECK = "/envoy.service.auth.v3.Authorization/Check"


def test_bytes_that_are_no_check_request_are_an_explicit_deny(
    server: Ports,
) -> None:
    with H2Client(server.port) as client:
        answer = client.call(CHECK, [frame(b"\xff\xff\xff not a protobuf")])
    assert answer.grpc_status == 0
    response = external_auth_pb2.CheckResponse.FromString(answer.data[5:])
    assert_grpc_decision(response, Reason.INTERNAL_ERROR)


def test_a_check_the_wire_breaks_is_never_an_allow(server: Ports) -> None:
    """Truncated, oversized, undecodable or deadline-expired: an error status
    (Envoy's failure_mode_allow decides, as for any error), never an OK."""
    good = check_request("/headers", {"authorization": f"Bearer {GOOD}"}).SerializeToString()
    broken: list[tuple[list[bytes], tuple[tuple[str, str], ...]]] = [
        ([frame(good)[:-3]], (("grpc-timeout", "2S"),)),
        ([b"\x01" + len(good).to_bytes(4, "big") + good], (("grpc-encoding", "snappy"),)),
        ([b"\x00" + (8 * 1024 * 1024).to_bytes(4, "big") + good], ()),
    ]
    for chunks, extra in broken:
        with H2Client(server.port) as client:  # one connection each: a server may drop one
            answer = client.call(CHECK, chunks, extra=extra)
        assert answer.grpc_status not in (None, 0), answer
        assert answer.data == b""
    packed = gzip.compress(good)
    with H2Client(server.port) as client:
        answer = client.call(
            CHECK, [b"\x01" + len(packed).to_bytes(4, "big") + packed],
            extra=(("grpc-encoding", "gzip"),),
        )  # fmt: skip
    assert answer.grpc_status == 0  # gzip is decoded: the same allow as uncompressed
    assert_grpc_decision(external_auth_pb2.CheckResponse.FromString(answer.data[5:]), Reason.OK)
