"""The TSB / Istio demo token (notes §2.2) end to end, with an injected clock.

The token expires on 2030-03-17, so the server's clock is pinned to 2023
instead of the real time: this test keeps passing after that date.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .support import GrpcClient, ServerThread, app_factory, check_request, http_check
from .test_jwt_policy import TSB_TOKEN

DEMO = Path(__file__).parents[2] / "deploy" / "extauthz" / "demo-policy.yaml"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with ServerThread(app_factory(DEMO, clock=lambda: 1_700_000_000.0)) as srv:
        yield srv


@pytest.mark.parametrize(
    ("path", "token", "allowed"),
    [
        ("/headers", TSB_TOKEN, True),
        ("/get", TSB_TOKEN, False),
        ("/headers", None, False),
        ("/ip", None, False),  # Envoy leaves /ip unchecked in the blog; we never see it
    ],
)
def test_tsb_demo_over_grpc_and_http(
    server: ServerThread, path: str, token: str | None, allowed: bool
) -> None:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    client = GrpcClient(server.port)
    response = client.check(check_request(path, headers))
    client.close()
    assert (response.status.code == 0) is allowed
    result = http_check(server.http_port, "/check/-" + path, list(headers.items()))
    assert (result.status == 200) is allowed
    if not allowed:
        assert result.status == 403
        assert response.denied_response.status.code == 403
