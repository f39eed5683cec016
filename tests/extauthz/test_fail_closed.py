"""Fail-closed behaviour: random requests and injected faults never allow or go empty."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.auth.v3 import external_auth_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extauthz.jwt_policy import CheckAttributes
from extauthz.reasons import Decision

from .cases import GOOD
from .jwtkit import HS_SECRET
from .policies import write_policies
from .support import GrpcClient, ServerThread, app_factory, check_request, http_check


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    os.environ["EXTAUTHZ_TEST_SECRET"] = HS_SECRET.decode()
    try:
        config = write_policies(tmp_path_factory.mktemp("fc"))
        with ServerThread(app_factory(config)) as srv:
            yield srv
    finally:
        os.environ.pop("EXTAUTHZ_TEST_SECRET", None)


@pytest.fixture(scope="module")
def client(server: ServerThread) -> Iterator[GrpcClient]:
    c = GrpcClient(server.port)
    yield c
    c.close()


def assert_explicit(response: external_auth_pb2.CheckResponse) -> None:
    assert response.ByteSize() > 0
    if response.status.code == 0:
        assert response.HasField("ok_response")
    else:
        assert response.status.code == 7
        assert response.denied_response.status.code == 403
        keys = [h.header.key for h in response.denied_response.headers]
        assert "x-ext-authz-reason" in keys


text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=60)
token_like = st.one_of(
    st.just(GOOD),
    st.builds(lambda a, b: a + b, st.sampled_from([GOOD[:40], GOOD[:-3], "eyJ", ""]), text),
    st.from_regex(
        r"[A-Za-z0-9_\-]{0,30}\.[A-Za-z0-9_\-]{0,30}\.[A-Za-z0-9_\-]{0,30}", fullmatch=True
    ),
)
auth_value = st.one_of(
    st.builds(
        lambda scheme, sp, tok: scheme + sp + tok,
        st.sampled_from(["Bearer", "bearer", "Basic", "", "BEARER"]),
        st.sampled_from([" ", "  ", "", "\t"]),
        token_like,
    ),
    text,
)
path = st.one_of(
    text,
    st.builds(lambda a, b: a + b, st.sampled_from(["/headers", "/", "//", "/%2e%2e", "/%"]), text),
)
policy = st.one_of(
    st.none(),
    st.sampled_from(["hs", "seg", "rs", "es", "iss", "hdr", "allow", "deny", "mixed"]),
    text,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    path=path,
    auths=st.lists(auth_value, max_size=3),
    extra=st.dictionaries(text, text, max_size=4),
    policy=policy,
    raw=st.booleans(),
    raw_bytes=st.lists(st.binary(max_size=40), max_size=2),
)
def test_random_check_requests_get_an_explicit_answer(
    client: GrpcClient,
    path: str,
    auths: list[str],
    extra: dict[str, str],
    policy: str | None,
    raw: bool,
    raw_bytes: list[bytes],
) -> None:
    if raw:
        entries = [("authorization", a.encode()) for a in auths]
        entries += [("authorization", b) for b in raw_bytes] + [(":path", path.encode())]
        request = check_request(path, raw_headers=entries, policy=policy)
    else:
        headers = dict(extra)
        for i, value in enumerate(auths):
            headers[["authorization", "Authorization", "AUTHORIZATION"][i]] = value
        request = check_request(path, headers, policy=policy)
    assert_explicit(client.check(request))


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=300))
def test_random_bytes_as_check_request(client: GrpcClient, data: bytes) -> None:
    try:
        request = external_auth_pb2.CheckRequest.FromString(data)
    except Exception:
        request = external_auth_pb2.CheckRequest(
            attributes={"request": {"http": {"header_map": base_pb2.HeaderMap()}}}
        )
    assert_explicit(client.check(request))


class ExplodingEngine:
    """Fault injection: an engine that raises, standing in for any internal bug."""

    default_policy = "hs"

    def decide(self, attrs: CheckAttributes, now: float) -> Decision:
        raise RuntimeError("boom")

    def select(self, attrs: CheckAttributes) -> Any:
        raise RuntimeError("boom")


def test_engine_exception_becomes_explicit_deny_in_both_modes(
    server: ServerThread, client: GrpcClient
) -> None:
    assert server.app is not None
    service = server.app.service
    real = service.engine
    swapped = __import__("threading").Event()

    def swap(engine: Any) -> None:
        service.engine = engine
        swapped.set()

    server.call_soon(lambda: swap(ExplodingEngine()))
    swapped.wait(5)
    try:
        response = client.check(check_request("/headers", {"authorization": f"Bearer {GOOD}"}))
        assert response.status.code == 7
        assert response.denied_response.status.code == 403
        assert json.loads(response.denied_response.body)["reason"] == "internal_error"
        result = http_check(
            server.http_port, "/check/-/headers", [("authorization", f"Bearer {GOOD}")]
        )
        assert result.status == 403
        assert result.header("x-ext-authz-reason") == "internal_error"
    finally:
        swapped.clear()
        server.call_soon(lambda: swap(real))
        swapped.wait(5)
    assert (
        client.check(check_request("/headers", {"authorization": f"Bearer {GOOD}"})).status.code
        == 0
    )
