"""The path-claim policy inside Envoy, delivered over ADS by mgmt-api.

``test_jwt_local_equivalence.py`` proves the local form decides as extauthz
does on a compiled static config; this proves the same compile reaches a
gateway over ADS (mgmt-api packs the Lua filter's config, the gateway ACKs
it) and that the route's requests are then decided without a Check.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from extauthz.cli import mint_demo_token
from tests.support.envoy import get_envoyconfig
from tests.support.gateway import CLUSTER_PATH, Gateway, GatewayStack

SECRET = "gateway-local-hmac-secret-0123456789abcdef"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayStack]:
    st = GatewayStack(Path(tmp_path_factory.mktemp("gateway-local")))
    try:
        st.backend("default.app")
        st.route("secure.web", "/headers", backend="default.app")
        st.jwt_security(SECRET, enforcement=None)  # unset: local where exact
        st.gateway()
        st.converged()
        yield st
    finally:
        st.close()


def _checks(gateway: Gateway) -> int:
    stats = gateway.envoy.admin("GET", "/stats?filter=^cluster.extauthz.upstream_rq_total$")
    return int(stats.text.split(":")[1]) if ":" in stats.text else 0


def test_the_envoyconfig_says_the_route_is_enforced_locally(stack: GatewayStack) -> None:
    config = get_envoyconfig(stack.admin, CLUSTER_PATH)
    (route,) = [r for r in config["routes"] if "workloads" in r]
    assert route["enforcement"]["path"] == "local"


def test_the_gateway_decides_alone_and_refers_what_it_cannot_judge(stack: GatewayStack) -> None:
    gateway = stack.gateways[0]
    before = _checks(gateway)
    assert gateway.get("/headers/x", mint_demo_token(SECRET, "/headers", 600)).status_code == 200
    denied = gateway.get("/headers", mint_demo_token(SECRET, "/admin", 600))
    assert (denied.status_code, denied.headers["x-ext-authz-reason"]) == (403, "path_not_allowed")
    assert _checks(gateway) == before
    # No token: jwt_authn has nothing to verify, so extauthz decides.
    missing = gateway.get("/headers")
    assert (missing.status_code, missing.headers["x-ext-authz-reason"]) == (
        403,
        "missing_authorization",
    )
    assert _checks(gateway) == before + 1
