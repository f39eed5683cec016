"""The "sidecar services" placement through a real gateway Envoy: ratelimit and
extauthz listen on Unix domain sockets (``--listen unix:/PATH``), mgmt-api is
told ``unix:///PATH`` (the node's ratelimitService, the SecuritySetting's
external URI) and renders ``pipe`` clusters; requests go to the gateway only.

A 200 needs extauthz's allow, a 403 its deny and a 429 ratelimit's count, so
each answer proves the gateway reached that service over its socket.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from extauthz.cli import mint_demo_token
from tests.support.gateway import GatewayStack

SECRET = "gateway-uds-hmac-secret-0123456789abcdef"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayStack]:
    st = GatewayStack(Path(tmp_path_factory.mktemp("gw-uds")), transport="uds")
    try:
        st.backend("default.app")
        st.route("secure.web", "/headers", backend="default.app")
        st.jwt_security(SECRET)
        st.rate_limit("secure.web-limit", "web", (3, "Minute"))
        st.gateway()
        st.converged()
        yield st
    finally:
        st.close()


def test_the_gateway_reaches_both_services_over_their_sockets(stack: GatewayStack) -> None:
    assert stack.service_uri("extauthz").startswith("unix:///")
    gateway = stack.gateways[0]
    left = 60 - time.time() % 60
    if left < 15:  # the 3-a-minute window must hold the four calls below
        time.sleep(left + 0.05)
    assert stack.redis is not None
    stack.redis.command("FLUSHALL")
    token = mint_demo_token(SECRET, "/headers", 600)
    assert gateway.get("/headers", "not-a-token").status_code == 403  # extauthz denied
    answers = [gateway.get("/headers", token).status_code for _ in range(4)]
    assert answers == [200, 200, 200, 429]  # extauthz allowed; ratelimit counted
