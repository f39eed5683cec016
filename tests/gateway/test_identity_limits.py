"""Limits per verified identity (issue 26, item 1) through a real gateway Envoy.

ext_authz (subscribed to mgmt-api) verifies the token and publishes the
claims the cluster's BackendTrafficPolicies select on as dynamic metadata;
the gateway's rate-limit filter, which runs after ext_authz, reads them with
Envoy's ``metadata`` action and asks the ratelimit service (on a real
redis-server). Nothing here calls the services directly.

Routes: ``secure.web`` (``/headers``), which the security group's JWT policy
checks, limited per ``sub`` (2 an hour) and for ``org: acme`` as a whole
(5 an hour); ``default.open`` (``/open``), which no ext_authz policy checks,
with a policy that selects on ``sub`` (an error in the status) and a plain
rule of 3 an hour that still applies. Hour windows, so no test runs into a
window edge (and :func:`fresh_counters` waits one out if it is near).
"""

from __future__ import annotations

import base64
import json
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest

from tests.support.gateway import CLUSTER_PATH, Gateway, GatewayStack

SECRET = "identity-limits-hmac-secret-0123456789"
PER_USER = 2
PER_ORG = 5
OPEN_PLAIN = 3


def claims_policy(route: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "spec": {
            "targetRef": {"kind": "HTTPRoute", "name": route},
            "rateLimit": {"type": "Global", "global": {"rules": rules}},
        }
    }


def per_claim(claim: dict[str, Any], requests: int) -> dict[str, Any]:
    return {
        "clientSelectors": [{"jwtClaims": [claim]}],
        "limit": {"requests": requests, "unit": "Hour"},
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayStack]:
    st = GatewayStack(Path(tmp_path_factory.mktemp("identity")))
    try:
        st.backend("default.app")
        st.route("secure.web", "/headers")
        st.route("default.open", "/open")
        st.jwt_security(SECRET)
        web = claims_policy(
            "web",
            [
                per_claim({"name": "sub", "type": "Distinct"}, PER_USER),
                per_claim({"name": "org", "type": "Exact", "value": "acme"}, PER_ORG),
            ],
        )
        st.put("backendtrafficpolicies", "secure.web-ids", "backendTrafficPolicy", web)
        uncovered = claims_policy(
            "open",
            [
                per_claim({"name": "sub", "type": "Distinct"}, 1),
                {"limit": {"requests": OPEN_PLAIN, "unit": "Hour"}},
            ],
        )
        st.put("backendtrafficpolicies", "default.open-ids", "backendTrafficPolicy", uncovered)
        st.gateway()
        st.converged()
        yield st
    finally:
        st.close()


@pytest.fixture
def gateway(stack: GatewayStack) -> Gateway:
    fresh_counters(stack)
    return stack.gateways[0]


def fresh_counters(stack: GatewayStack, margin: float = 30.0) -> None:
    """Empty counters, with enough of the current hour left for one test."""
    left = 3600 - time.time() % 3600
    if left < margin:
        time.sleep(left + 0.05)
    assert stack.redis is not None
    stack.redis.command("FLUSHALL")


def token(secret: str = SECRET, ttl: int = 600, path: str = "/headers", **claims: Any) -> str:
    now = int(time.time())
    payload = {"path": base64.b64encode(path.encode()).decode(), "nbf": now, "exp": now + ttl}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyJWT warns about a short test secret
        return jwt.encode({**payload, **claims}, secret, algorithm="HS256")


def unsigned(**claims: Any) -> str:
    """A token with ``alg: none`` and no signature: what a client can write by hand."""
    now = int(time.time())
    payload = {
        "path": base64.b64encode(b"/headers").decode(),
        "nbf": now,
        "exp": now + 600,
        **claims,
    }

    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(payload)}."


def codes(gateway: Gateway, bearer: str, n: int, path: str = "/headers") -> list[int]:
    return [gateway.get(path, bearer).status_code for _ in range(n)]


def test_three_users_each_have_their_own_bucket(gateway: Gateway) -> None:
    over = [200] * PER_USER + [429]
    for user in ("alice", "bob", "carol"):
        assert codes(gateway, token(sub=user), PER_USER + 1) == over, user
    # Still over for each, and a fourth user is untouched by the other three.
    assert gateway.get("/headers", token(sub="alice")).status_code == 429
    first = gateway.get("/headers", token(sub="dave"))
    assert first.status_code == 200
    assert first.headers["x-ratelimit-remaining"] == str(PER_USER - 1)


def test_an_exact_claim_value_shares_one_bucket_and_only_that_value(gateway: Gateway) -> None:
    acme = [gateway.get("/headers", token(sub=f"a{i}", org="acme")) for i in range(3)]
    acme += [gateway.get("/headers", token(sub="a3", org="acme")) for _ in range(2)]
    assert [r.status_code for r in acme] == [200] * PER_ORG
    # The org's bucket is empty for every acme user, a fresh one included ...
    assert gateway.get("/headers", token(sub="a4", org="acme")).status_code == 429
    # ... and another org is counted per user only.
    assert codes(gateway, token(sub="o1", org="other"), PER_USER + 1) == [200, 200, 429]


def test_changing_sub_in_a_token_not_signed_by_the_key_is_403_not_a_fresh_bucket(
    gateway: Gateway,
) -> None:
    assert codes(gateway, token(sub="mallory"), PER_USER + 1) == [200, 200, 429]
    for forged in (
        unsigned(sub="mallory-2"),
        token(secret="another-secret-0123456789abcdef0123", sub="mallory-3"),
    ):
        response = gateway.get("/headers", forged)
        assert response.status_code == 403, response.text
        assert "x-ratelimit-remaining" not in response.headers
    assert gateway.get("/headers", token(sub="mallory")).status_code == 429


def test_an_expired_token_is_denied_first_and_consumes_nothing(gateway: Gateway) -> None:
    for _ in range(5):
        assert gateway.get("/headers", token(ttl=-120, sub="erin")).status_code == 403
    first = gateway.get("/headers", token(sub="erin"))
    assert first.status_code == 200
    assert first.headers["x-ratelimit-remaining"] == str(PER_USER - 1)


def test_claims_on_a_route_no_ext_authz_checks_are_an_error_and_other_rules_apply(
    stack: GatewayStack, gateway: Gateway
) -> None:
    errors = stack.status().get("policyErrors", [])
    policy = f"{CLUSTER_PATH.removeprefix('/v2/')}/backendtrafficpolicies/default.open-ids"
    assert [(e["policy"], e["route"]) for e in errors] == [(policy, "httproute/default/open")]
    assert "no ext_authz policy checks" in errors[0]["message"]
    own = stack.admin.get(f"{CLUSTER_PATH}/backendtrafficpolicies/default.open-ids/status")
    assert own.json()["policyErrors"] == errors
    checked = stack.admin.get(f"{CLUSTER_PATH}/backendtrafficpolicies/secure.web-ids/status")
    assert "policyErrors" not in checked.json()
    # The claim rule (1 per sub) never applies; the plain rule (3) does, token or not.
    bearer = token(sub="zed", path="/open")
    assert codes(gateway, bearer, OPEN_PLAIN + 1, "/open") == [200] * OPEN_PLAIN + [429]
