"""The spec's gateway behaviours (4.10, 4.11) through a real Envoy configured over ADS.

One gateway Envoy, booted with the minimal bootstrap, gets everything from
mgmt-api; ratelimit (on a real redis-server) and extauthz are subscribed to
mgmt-api as in production. Requests go to the gateway over HTTP; nothing
here calls the services directly.

Routes: ``secure.web`` (``/headers``), in a namespace the security group
selects and limited by a BackendTrafficPolicy; ``default.open`` (``/open``)
and ``default.slow`` (``/slow``), in a namespace nothing selects.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest

from extauthz.cli import mint_demo_token
from tests.support.gateway import SLOW_SECONDS, Gateway, GatewayStack
from tests.support.processes import wait_until

SECRET = "gateway-hmac-secret-0123456789abcdef"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayStack]:
    st = GatewayStack(Path(tmp_path_factory.mktemp("gateway")))
    try:
        st.backend("default.app")
        st.route("secure.web", "/headers", backend="default.app")
        st.route("default.open", "/open", backend="default.app")
        st.route("default.slow", "/slow", backend="default.app")
        # The ext_authz service decides (its decision lines are tested here);
        # the same policy inside Envoy: test_jwt_local_equivalence.py.
        st.jwt_security(SECRET, enforcement="external")
        st.rate_limit("secure.web-limit", "web", (3, "Minute"), (100, "Hour"))
        st.gateway()
        st.converged()
        yield st
    finally:
        st.close()


@pytest.fixture
def gateway(stack: GatewayStack) -> Gateway:
    return stack.gateways[0]


def token(path: str = "/headers", ttl: int = 600) -> str:
    return mint_demo_token(SECRET, path, ttl)


def fresh_minute(stack: GatewayStack, margin: float = 12.0) -> None:
    """Empty counters, with enough of the current minute left for one test."""
    left = 60 - time.time() % 60
    if left < margin:
        time.sleep(left + 0.05)
    assert stack.redis is not None
    stack.redis.command("FLUSHALL")


def test_a_valid_token_gets_the_upstream_and_the_exact_headers(
    stack: GatewayStack, gateway: Gateway
) -> None:
    fresh_minute(stack)
    response = gateway.get("/headers", token())
    assert response.status_code == 200, response.text
    assert response.text == "app\n"
    assert response.headers["x-ratelimit-limit"] == "3, 3;w=60, 100;w=3600"
    assert response.headers["x-ratelimit-remaining"] == "2"
    assert 0 < int(response.headers["x-ratelimit-reset"]) <= 60
    assert "x-proxy-ratelimited" not in response.headers


@pytest.mark.parametrize(
    ("case", "authorization"),
    [
        ("no token", None),
        ("not a bearer", "Basic YWRtaW46YWRtaW4="),
        ("forged", "Bearer " + mint_demo_token("another-secret-0123456789abcdef", "/", 600)),
        ("expired", "Bearer " + mint_demo_token(SECRET, "/headers", -120)),
        ("path not granted", "Bearer " + mint_demo_token(SECRET, "/admin", 600)),
        ("garbage", "Bearer not.a.jwt"),
    ],
)
def test_a_bad_token_is_403_and_never_reaches_the_upstream(
    gateway: Gateway, case: str, authorization: str | None
) -> None:
    headers = {"authorization": authorization} if authorization else {}
    response = gateway.get("/headers", headers=headers)
    assert response.status_code == 403, case
    assert response.text != "app\n"


def test_the_path_claim_is_a_prefix_of_the_request_path(gateway: Gateway) -> None:
    granted = token("/head")
    assert gateway.get("/headers/sub", granted).status_code == 200
    assert gateway.get("/headers", token("/headers/sub")).status_code == 403


def test_over_the_limit_is_429_with_the_marker(stack: GatewayStack, gateway: Gateway) -> None:
    fresh_minute(stack)
    codes = [gateway.get("/headers", token()).status_code for _ in range(3)]
    assert codes == [200, 200, 200]
    over = gateway.get("/headers", token())
    assert over.status_code == 429
    assert over.headers["x-proxy-ratelimited"] == "true"
    assert over.headers["x-ratelimit-remaining"] == "0"


def test_a_denied_request_consumes_nothing(stack: GatewayStack, gateway: Gateway) -> None:
    fresh_minute(stack)
    for _ in range(5):
        assert gateway.get("/headers").status_code == 403
        assert gateway.get("/headers", token("/admin")).status_code == 403
    first = gateway.get("/headers", token())
    assert first.status_code == 200
    assert first.headers["x-ratelimit-remaining"] == "2"


def test_a_route_no_security_setting_selects_is_not_checked_nor_limited(
    gateway: Gateway,
) -> None:
    response = gateway.get("/open/anything")
    assert response.status_code == 200
    assert response.text == "app\n"
    assert "x-ratelimit-limit" not in response.headers


@pytest.mark.parametrize(
    "target", ["/open/../headers", "/open/%2e%2e/headers", "/open/%2E%2E/headers", "//headers"]
)
def test_path_tricks_are_normalized_before_routing_and_checks(
    gateway: Gateway, target: str
) -> None:
    """Each is ``/headers``, which needs a token: 403, not the open route's 200
    (nor a 404 that a rule for ``/headers`` would never see)."""
    assert gateway.raw_status(target) == 403


def test_an_unknown_path_is_404(gateway: Gateway) -> None:
    assert gateway.get("/nowhere").status_code == 404


def test_an_upstream_that_cannot_keep_up_gives_503_not_429(
    stack: GatewayStack, gateway: Gateway
) -> None:
    """Circuit breakers from the cluster's settings (spec 4.10.7): one request at a
    time to the upstream, none queued; concurrent slow requests overflow."""
    stack.cluster_spec(
        circuitBreakers={"maxConnections": 1, "maxPendingRequests": 1, "maxRequests": 1}
    )
    stack.converged()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        responses = list(
            pool.map(lambda _: gateway.get("/slow", timeout=SLOW_SECONDS * 10), range(8))
        )
    codes = sorted(r.status_code for r in responses)
    assert 200 in codes and 503 in codes, codes
    assert 429 not in codes
    overloaded = next(r for r in responses if r.status_code == 503)
    assert overloaded.headers.get("x-envoy-overloaded") == "true"
    stack.cluster_spec(circuitBreakers=None)
    stack.converged()
    wait_until(lambda: gateway.get("/open").status_code == 200, 30, "the gateway to serve again")


def _decision_lines(stack: GatewayStack, service: str, decision_id: str) -> list[dict[str, Any]]:
    """The decision lines carrying ``decision_id`` in ``service``'s stderr (its default sink)."""
    lines = (stack.tmp / f"{service}.log").read_text(errors="replace").splitlines()
    found = []
    for line in lines:
        if decision_id in line:
            entry = json.loads(line)
            if entry.get("decision_id") == decision_id:
                found.append(entry)
    return found


def _one_line(stack: GatewayStack, service: str, decision_id: str) -> dict[str, Any]:
    """Wait (the writer is asynchronous) for the line; then there must be exactly one."""
    wait_until(lambda: _decision_lines(stack, service, decision_id), 30, f"{service}'s line")
    found = _decision_lines(stack, service, decision_id)
    assert len(found) == 1, found
    return found[0]


def test_a_403_names_its_decision_line_which_holds_no_token(
    stack: GatewayStack, gateway: Gateway
) -> None:
    now = int(time.time())
    # A well-signed token for another path: denied after verification, sub known.
    claims = {"path": base64.b64encode(b"/admin").decode(), "sub": "alice@example.com"}
    bad = jwt.encode({**claims, "nbf": now, "exp": now + 600}, SECRET, algorithm="HS256")
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    denied = gateway.get("/headers", bad, headers={"traceparent": traceparent})
    assert denied.status_code == 403
    decision_id = denied.headers["x-decision-id"]
    line = _one_line(stack, "extauthz", decision_id)
    assert line["reason"] == "path_not_allowed"
    assert line["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert (line["method"], line["path"], line["decision"]) == ("GET", "/headers", "deny")
    assert line["principal"].startswith("h:")
    text = json.dumps(line)
    for secret in (bad, bad.split(".")[2], SECRET, "alice@example.com"):
        assert secret not in text


def test_a_429_names_its_decision_line(stack: GatewayStack, gateway: Gateway) -> None:
    fresh_minute(stack)
    good = token()
    codes = [gateway.get("/headers", good).status_code for _ in range(3)]
    assert codes == [200, 200, 200]
    over = gateway.get("/headers", good)
    assert over.status_code == 429
    decision_id = over.headers["x-decision-id"]
    line = _one_line(stack, "ratelimit", decision_id)
    assert line["decision"] == "over_limit"
    (hit,) = line["descriptors"]
    assert hit["limit"]["requests_per_unit"] == 3
    assert hit["limit"]["unit"].lower() == "minute"
    assert all(e["value"].startswith("h:") for e in hit["entries"]), hit
    text = json.dumps(line)
    assert good not in text and SECRET not in text
